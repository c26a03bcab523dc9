// A project's Storage page: what full copies would store against what the CAS stores, and an
// SVG chart of the growth over time with its numbers as a table.

import {
  bytes, dataTable, fill, formatBytes, formatCount, formatDateTime, h, numTh, uid
} from './common.js';
import { s } from './dom.js';
import { formatRatio, parseTime, time } from './format.js';
import { api, projectApi } from './api.js';
import { projectFrame } from './projects.js';

/** How what the CAS stores compares with full copies, in words that fit either way. */
function storedNote(logical, stored) {
  if (!(stored > 0)) return '';
  const r = logical / stored;
  if (r >= 1) return ` (${formatRatio(r)} less than full copies)`;
  return ' (more than full copies: with this little history, node and index overhead outweighs what is shared)';
}

export async function storageView(ctx) {
  const { pid } = ctx;
  const frame = projectFrame('storage', 'Storage');
  const [project, st] = await Promise.all([
    api('GET', projectApi(pid), { main: true }),
    api('GET', projectApi(pid, '/storage')),
  ]);
  if (ctx.stale()) return;
  frame.setProject(project);
  const stat = (label, value, testid, hint) => h('div', { class: 'stat' },
    h('dt', {}, label), h('dd', { testid }, value), hint ? h('dd', { class: 'stat-hint' }, hint) : null);
  fill(frame.body,
    h('section', { class: 'card', 'aria-labelledby': 'storage-heading', testid: 'storage' },
      h('h2', { id: 'storage-heading' }, 'What this project costs'),
      h('p', { class: 'hint' }, 'Every revision is a tree of content-addressed nodes: what did not change between revisions is stored once.'),
      h('dl', { class: 'stats' },
        stat('Full copies of every kept revision', bytes(st.logicalBytes, 'storage-logical'), null, 'what plain copies would store'),
        stat('What the CAS stores', bytes(st.readyStoredBytes, 'storage-stored'), null, 'compressed, deduplicated'),
        stat('Deduplication', h('span', { testid: 'dedup-ratio', title: String(st.dedupRatio) }, formatRatio(st.dedupRatio)), null, 'full copies ÷ stored'),
        stat('Nodes', formatCount(st.nodeCount), 'storage-nodes'),
        stat('Kept revisions', formatCount(st.keptVersions), 'storage-kept'),
        stat('Pruned revisions', formatCount(st.prunedVersions), 'storage-pruned'))),
    h('section', { class: 'card', 'aria-labelledby': 'chart-heading' },
      h('h2', { id: 'chart-heading' }, 'Growth over time'),
      storageChart(st)));
}

/** Round steps for a byte axis from 0 to `max`: whole B, KiB, MiB… at 1, 2, 2.5 or 5 × 10ⁿ. */
function byteTicks(max, count = 4) {
  if (!(max > 0)) return [0, 1];
  let unit = 1;
  while (max / unit >= 1024 && unit < 1024 ** 6) unit *= 1024;
  const raw = max / unit / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = ([1, 2, 2.5, 5, 10].map((m) => m * mag).find((st) => st >= raw) ?? raw) * unit;
  const ticks = [];
  for (let i = 0; i * step < max + step * 0.999 && i <= count + 2; i += 1) ticks.push(i * step);
  return ticks;
}

/** A formatter for time-axis labels, fine enough to tell the span's ends apart. */
function axisTimeFormat(spanMs) {
  if (spanMs < 10 * 60_000) return new Intl.DateTimeFormat(undefined, { timeStyle: 'medium' });
  if (spanMs < 24 * 3_600_000) return new Intl.DateTimeFormat(undefined, { timeStyle: 'short' });
  return new Intl.DateTimeFormat(undefined, { dateStyle: 'medium' });
}

/**
 * An SVG chart of the cumulative logical bytes of the kept revisions (what full copies would
 * store) with a line at what the CAS stores, and the same numbers as a table.
 */
function storageChart(st) {
  const points = (Array.isArray(st.series) ? st.series : [])
    .map((p) => ({ t: parseTime(p?.savedAt)?.getTime(), bytes: Number(p?.logicalBytes), iso: p?.savedAt, versions: p?.versions }))
    .filter((p) => Number.isFinite(p.t) && Number.isFinite(p.bytes))
    .sort((a, b) => a.t - b.t);
  const stored = Number(st.readyStoredBytes);
  if (points.length === 0) {
    return h('p', { class: 'empty', testid: 'storage-chart-empty' },
      'No history to chart yet: the chart appears once revisions have been saved.');
  }
  const W = 720;
  const H = 300;
  const m = { left: 84, right: 20, top: 20, bottom: 48 };
  const iw = W - m.left - m.right;
  const ih = H - m.top - m.bottom;
  const t0 = points[0].t;
  const t1 = points[points.length - 1].t;
  const span = t1 - t0 || 3_600_000;
  const x = (t) => m.left + (points.length === 1 ? iw / 2 : ((t - t0) / span) * iw);
  const maxY = Math.max(stored || 0, ...points.map((p) => p.bytes));
  const ticks = byteTicks(maxY);
  const top = ticks[ticks.length - 1] || 1;
  const y = (v) => m.top + ih - (v / top) * ih;
  const fmt = (v) => Math.round(v * 10) / 10;

  // Cumulative bytes change at each save: a step line.
  let line = `M${fmt(x(points[0].t))},${fmt(y(points[0].bytes))}`;
  for (let i = 1; i < points.length; i += 1) {
    line += ` H${fmt(x(points[i].t))} V${fmt(y(points[i].bytes))}`;
  }
  const lastX = points.length === 1 ? m.left + iw : x(points[points.length - 1].t);
  if (points.length === 1) line = `M${m.left},${fmt(y(points[0].bytes))} H${fmt(lastX)}`;
  const area = `${line} V${fmt(y(0))} H${fmt(points.length === 1 ? m.left : x(points[0].t))} Z`;

  const first = points[0];
  const last = points[points.length - 1];
  const titleId = uid('chart-title');
  const descId = uid('chart-desc');
  const summary = `From ${formatDateTime(new Date(first.t))} to ${formatDateTime(new Date(last.t))}, `
    + `full copies of the kept revisions grew from ${formatBytes(first.bytes)} to ${formatBytes(last.bytes)}; `
    + `the CAS stores ${formatBytes(stored)}${storedNote(last.bytes, stored)}.`;

  const axisFormat = axisTimeFormat(t1 - t0);
  let xLabels = points.length === 1
    ? [[first.t, 'middle', m.left + iw / 2]]
    : [[t0, 'start', x(t0)], [t0 + span / 2, 'middle', x(t0 + span / 2)], [t1, 'end', x(t1)]];
  // Labels that would read the same say nothing: keep the first of each.
  const seenLabels = new Set();
  xLabels = xLabels.filter(([t]) => {
    const text = axisFormat.format(new Date(t));
    if (seenLabels.has(text)) return false;
    seenLabels.add(text);
    return true;
  });

  const svg = s('svg', {
    class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-labelledby': `${titleId} ${descId}`, testid: 'storage-chart',
    preserveAspectRatio: 'xMidYMid meet',
  },
  s('title', { id: titleId }, 'Full copies versus what the CAS stores'),
  s('desc', { id: descId }, summary),
  // Grid and y axis labels.
  ticks.map((v) => [
    s('line', { class: 'chart-grid', x1: m.left, x2: m.left + iw, y1: fmt(y(v)), y2: fmt(y(v)) }),
    s('text', { class: 'chart-label', x: m.left - 8, y: fmt(y(v)), 'text-anchor': 'end', 'dominant-baseline': 'middle' }, formatBytes(v)),
  ]),
  s('path', { class: 'chart-area', d: area }),
  s('path', { class: 'chart-line', d: line, fill: 'none' }),
  points.length <= 60 ? points.map((p) => s('circle', { class: 'chart-dot', cx: fmt(points.length === 1 ? m.left + iw / 2 : x(p.t)), cy: fmt(y(p.bytes)), r: 3 })) : null,
  Number.isFinite(stored) ? [
    s('line', { class: 'chart-stored', x1: m.left, x2: m.left + iw, y1: fmt(y(stored)), y2: fmt(y(stored)) }),
    s('text', { class: 'chart-label chart-stored-label', x: m.left + iw, y: fmt(y(stored)) - 6, 'text-anchor': 'end' }, `CAS stores ${formatBytes(stored)}`),
  ] : null,
  // X axis.
  s('line', { class: 'chart-axis', x1: m.left, x2: m.left + iw, y1: m.top + ih, y2: m.top + ih }),
  xLabels.map(([t, anchor, px]) => s('text', { class: 'chart-label', x: fmt(px), y: m.top + ih + 20, 'text-anchor': anchor }, axisFormat.format(new Date(t)))),
  s('text', { class: 'chart-label', x: m.left + iw / 2, y: H - 6, 'text-anchor': 'middle' }, 'Saved at'));

  const legend = h('ul', { class: 'legend' },
    h('li', {}, h('span', { class: 'swatch swatch-logical', 'aria-hidden': 'true' }), 'What full copies of the kept revisions would store (cumulative)'),
    h('li', {}, h('span', { class: 'swatch swatch-stored', 'aria-hidden': 'true' }), 'What the CAS stores now'));

  const shown = points.length > 500 ? points.slice(-500) : points;
  const table = h('details', { class: 'chart-data' },
    h('summary', {}, 'The chart\'s numbers as a table'),
    points.length > shown.length ? h('p', { class: 'hint' }, `The latest ${formatCount(shown.length)} of ${formatCount(points.length)} points.`) : null,
    dataTable({
      testid: 'storage-series',
      caption: 'Cumulative bytes of full copies by save time',
      head: ['Saved at', numTh('Revisions counted'), numTh('Full copies (cumulative)')],
      rows: shown.map((p) => h('tr', {},
        h('td', {}, time(p.iso)),
        h('td', { class: 'num' }, typeof p.versions === 'number' ? formatCount(p.versions) : '—'),
        h('td', { class: 'num' }, bytes(p.bytes)))),
    }));
  return h('figure', { class: 'chart-figure' },
    h('div', { class: 'chart-wrap' }, svg),
    h('figcaption', { testid: 'storage-chart-summary' }, summary),
    legend,
    table);
}
