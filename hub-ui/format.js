// Formatting for the hub UI: ratios, times, roles, notebook sources, badges and tag lists (counts,
// bytes and plurals, which the admin UI shares, are in common.js). The plain ones answer text;
// time(), the badges and tagList() answer elements (with the data as text).

import { h, timeElement } from './common.js';

export const ROLE_RANK = { viewer: 0, editor: 1, manager: 2, admin: 3 };

/** A ratio as the storage page shows it: two decimals and "×" (e.g. 3.42×). */
export const formatRatio = (r) => (typeof r === 'number' && Number.isFinite(r) ? `${r.toFixed(2)}×` : '—');

export const parseTime = (iso) => {
  const d = iso ? new Date(iso) : null;
  return d && !Number.isNaN(d.getTime()) ? d : null;
};

/** An RFC 3339 time in local time (to the minute), the ISO value in datetime and the tooltip. */
export function time(iso, testid) {
  const d = parseTime(iso);
  if (!d) return h('span', { testid }, iso ? String(iso) : '—');
  return timeElement(d, String(iso), { testid });
}

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
