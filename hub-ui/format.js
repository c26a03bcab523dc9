// Formatting for the hub UI: counts, bytes, ratios, times, roles, notebook sources, badges
// and tag lists. The plain ones answer text; bytes(), time(), the badges and tagList() answer
// elements (with the data as text).

import { h } from './dom.js';

export const ROLE_RANK = { viewer: 0, editor: 1, manager: 2, admin: 3 };

const numberFormat = new Intl.NumberFormat();
export const dateTimeFormat = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'short' });
const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'];

export const formatCount = (n) => (typeof n === 'number' && Number.isFinite(n) ? numberFormat.format(n) : '—');

export function formatBytes(n) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return '—';
  let value = n;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < BYTE_UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  if (unit === 0) return `${numberFormat.format(n)} B`;
  const digits = Math.abs(value) < 10 ? 2 : Math.abs(value) < 100 ? 1 : 0;
  return `${value.toFixed(digits)} ${BYTE_UNITS[unit]}`;
}

/** A ratio as the storage page shows it: two decimals and "×" (e.g. 3.42×). */
export const formatRatio = (r) => (typeof r === 'number' && Number.isFinite(r) ? `${r.toFixed(2)}×` : '—');

/** Bytes, human-readable, with the exact count in a tooltip. */
export const bytes = (n, testid) =>
  h('span', { testid, title: typeof n === 'number' ? `${numberFormat.format(n)} bytes` : null }, formatBytes(n));

export const parseTime = (iso) => {
  const d = iso ? new Date(iso) : null;
  return d && !Number.isNaN(d.getTime()) ? d : null;
};

/** An RFC 3339 time in local time, the ISO value in datetime and the tooltip. */
export function time(iso, testid) {
  const d = parseTime(iso);
  if (!d) return h('span', { testid }, iso ? String(iso) : '—');
  return h('time', { datetime: String(iso), title: String(iso), testid }, dateTimeFormat.format(d));
}

export const plural = (n, one, many = `${one}s`) => `${formatCount(n)} ${n === 1 ? one : many}`;
export const roleName = (role) => (role ? role[0].toUpperCase() + role.slice(1) : '—');
export const atLeast = (role, min) => (ROLE_RANK[role] ?? -1) >= ROLE_RANK[min];
export const isGit = (source) => source?.type === 'git';

export function sourceText(source) {
  if (!source) return '—';
  if (isGit(source)) {
    const where = [source.repository, source.branch && `branch ${source.branch}`].filter(Boolean).join(', ');
    return `Push sync from Git (${source.provider || 'git'}${where ? `: ${where}` : ''})`;
  }
  return 'Saved in the hub';
}

export const badge = (text, kind, testid) => h('span', { class: `badge${kind ? ` badge-${kind}` : ''}`, testid }, text);

export function statusBadge(status, testid) {
  const kind = { active: 'ok', draft: 'info', archived: 'muted', deleted: 'warn' }[status];
  return badge(status ?? '—', kind, testid);
}

export function tagList(tags) {
  if (!tags?.length) return h('span', { class: 'hint' }, '—');
  return h('ul', { class: 'tags', testid: 'tags' }, tags.map((t) => h('li', { class: 'tag' }, t)));
}
