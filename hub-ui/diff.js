// Comparing two revisions: Myers' line diff computed in the page, grouped into hunks, and
// rendered unified or side by side.

import { ApiError, dataTable, fill, formatBytes, formatCount, h, plural, uid } from './common.js';
import { diffHref, navigate } from './nav.js';
import { badge } from './format.js';
import { api, fetchContent, fileApiUrl, notebookApi, PAGE_LIMIT } from './api.js';
import { loadNotebook, notebookFrame } from './notebook.js';
import { revisionPicker, splitLines } from './files.js';

// Diffs: files compared per page, bytes per side, lines per side, and the edit distance the
// line diff explores before it gives up and shows both versions whole.
const MAX_DIFF_FILES = 200;
const MAX_DIFF_BYTES = 1024 * 1024;
const MAX_DIFF_LINES = 20000;
const MAX_EDIT_DISTANCE = 2000;
const MAX_DIFF_ROWS = 5000;
const DIFF_CONTEXT = 3;
const FETCH_CONCURRENCY = 4;

/**
 * Myers' O(ND) diff of two arrays of line ids; gives up (null) past `maxD` edits. Answers the
 * edit script in order: { t: ' ' | '-' | '+', ai, bi } with indices into `a` and `b`.
 */
function myers(a, b, maxD) {
  const n = a.length;
  const m = b.length;
  const max = n + m;
  if (max === 0) return [];
  const off = max + 1;
  const v = new Int32Array(2 * max + 3);
  const trace = [];
  let found = -1;
  outer: for (let d = 0; d <= max; d += 1) {
    if (d > maxD) return null;
    trace.push(v.slice(off - d - 1, off + d + 2));
    for (let k = -d; k <= d; k += 2) {
      let x = (k === -d || (k !== d && v[off + k - 1] < v[off + k + 1])) ? v[off + k + 1] : v[off + k - 1] + 1;
      let y = x - k;
      while (x < n && y < m && a[x] === b[y]) {
        x += 1;
        y += 1;
      }
      v[off + k] = x;
      if (x >= n && y >= m) {
        found = d;
        break outer;
      }
    }
  }
  const out = [];
  let x = n;
  let y = m;
  for (let d = found; d >= 0; d -= 1) {
    const vd = trace[d];
    const at = (k) => vd[k + d + 1];
    const k = x - y;
    const prevK = (k === -d || (k !== d && at(k - 1) < at(k + 1))) ? k + 1 : k - 1;
    const prevX = at(prevK);
    const prevY = prevX - prevK;
    while (x > prevX && y > prevY) {
      out.push({ t: ' ', ai: x - 1, bi: y - 1 });
      x -= 1;
      y -= 1;
    }
    if (d > 0) {
      if (x === prevX) out.push({ t: '+', bi: y - 1 });
      else out.push({ t: '-', ai: x - 1 });
    }
    x = prevX;
    y = prevY;
  }
  return out.reverse();
}

/**
 * A line diff: { ops: [{ t, a, b, text }] (1-based line numbers), approximate } where
 * `approximate` means the middle was too different for Myers within MAX_EDIT_DISTANCE and is
 * shown as removed then added whole.
 */
function diffLines(oldLines, newLines) {
  const ids = new Map();
  const idOf = (line) => {
    let id = ids.get(line);
    if (id === undefined) {
      id = ids.size;
      ids.set(line, id);
    }
    return id;
  };
  const A = Int32Array.from(oldLines, idOf);
  const B = Int32Array.from(newLines, idOf);
  let pre = 0;
  while (pre < A.length && pre < B.length && A[pre] === B[pre]) pre += 1;
  let suf = 0;
  while (suf < A.length - pre && suf < B.length - pre && A[A.length - 1 - suf] === B[B.length - 1 - suf]) suf += 1;
  const ops = [];
  for (let i = 0; i < pre; i += 1) ops.push({ t: ' ', a: i + 1, b: i + 1, text: oldLines[i] });
  const midA = A.subarray(pre, A.length - suf);
  const midB = B.subarray(pre, B.length - suf);
  const script = myers(midA, midB, MAX_EDIT_DISTANCE);
  if (script) {
    for (const op of script) {
      if (op.t === ' ') ops.push({ t: ' ', a: pre + op.ai + 1, b: pre + op.bi + 1, text: oldLines[pre + op.ai] });
      else if (op.t === '-') ops.push({ t: '-', a: pre + op.ai + 1, text: oldLines[pre + op.ai] });
      else ops.push({ t: '+', b: pre + op.bi + 1, text: newLines[pre + op.bi] });
    }
  } else {
    for (let i = 0; i < midA.length; i += 1) ops.push({ t: '-', a: pre + i + 1, text: oldLines[pre + i] });
    for (let i = 0; i < midB.length; i += 1) ops.push({ t: '+', b: pre + i + 1, text: newLines[pre + i] });
  }
  for (let i = 0; i < suf; i += 1) {
    const ai = A.length - suf + i;
    const bi = B.length - suf + i;
    ops.push({ t: ' ', a: ai + 1, b: bi + 1, text: oldLines[ai] });
  }
  return { ops, approximate: !script };
}

/** Groups changes with `context` lines around them into hunks. */
function toHunks(ops, context = DIFF_CONTEXT) {
  const ranges = [];
  let cur = null;
  ops.forEach((op, i) => {
    if (op.t === ' ') return;
    const start = Math.max(0, i - context);
    const end = Math.min(ops.length, i + context + 1);
    if (cur && start <= cur.end) cur.end = end;
    else {
      if (cur) ranges.push(cur);
      cur = { start, end };
    }
  });
  if (cur) ranges.push(cur);
  // Line numbers before each op, to name where a hunk starts.
  let aSeen = 0;
  let bSeen = 0;
  const before = ops.map((op) => {
    const at = [aSeen, bSeen];
    if (op.t !== '+') aSeen += 1;
    if (op.t !== '-') bSeen += 1;
    return at;
  });
  return ranges.map(({ start, end }) => {
    const slice = ops.slice(start, end);
    const aLen = slice.filter((op) => op.t !== '+').length;
    const bLen = slice.filter((op) => op.t !== '-').length;
    const [a0, b0] = before[start];
    return { aStart: aLen ? a0 + 1 : a0, aLen, bStart: bLen ? b0 + 1 : b0, bLen, ops: slice };
  });
}

/** Runs `fn` over `items`, at most `limit` at a time. */
async function eachLimited(items, limit, fn) {
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next;
      next += 1;
      await fn(items[i], i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}

export async function diffView(ctx) {
  const { pid, nid, params } = ctx;
  const frame = notebookFrame('diff-title');
  const [project, nb] = await loadNotebook(ctx);
  if (ctx.stale()) return;
  frame.set(project, nb, { title: 'Compare revisions', crumb: 'Compare' });
  const page = await api('GET', notebookApi(pid, nid, '/versions'), { query: { limit: PAGE_LIMIT } });
  if (ctx.stale()) return;
  const versions = page.items ?? [];
  const kept = versions.filter((v) => v.state !== 'pruned');
  const asRev = (v) => (/^\d+$/.test(v ?? '') ? Number(v) : null);
  const to = asRev(params.get('to')) ?? kept[0]?.revision ?? null;
  const from = asRev(params.get('from')) ?? kept.find((v) => v.revision < (to ?? Infinity))?.revision ?? null;
  let mode = params.get('view') === 'split' ? 'split' : 'unified';

  const fromPicker = revisionPicker(versions, from, nb.head_revision, 'diff-from', 'From revision', false);
  const toPicker = revisionPicker(versions, to, nb.head_revision, 'diff-to', 'To revision', false);
  const pickForm = h('form', { class: 'filters', testid: 'diff-form' },
    fromPicker, toPicker,
    h('div', { class: 'actions' }, h('button', { type: 'submit', testid: 'diff-submit' }, 'Compare')));
  pickForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const f = fromPicker.querySelector('select').value;
    const t = toPicker.querySelector('select').value;
    navigate(diffHref(pid, nid, f, t, mode === 'split' ? 'split' : null));
  });
  const modeRadio = (value, label, testid) => {
    const input = h('input', { type: 'radio', name: 'diff-mode', value, testid, checked: mode === value, id: uid('mode') });
    return h('span', { class: 'choice' }, input, h('label', { for: input.id }, label));
  };
  const modes = h('fieldset', { class: 'choices inline', testid: 'diff-mode' },
    h('legend', {}, 'Layout'),
    modeRadio('unified', 'Unified', 'diff-mode-unified'),
    modeRadio('split', 'Side by side', 'diff-mode-split'));
  const status = h('p', { class: 'listing-meta', testid: 'diff-status', 'aria-live': 'polite' });
  const results = h('div', { class: 'stack', testid: 'diff-results' });
  fill(frame.body, pickForm, modes, status, results);

  if (from == null || to == null) {
    status.textContent = 'There are not two revisions to compare yet.';
    return;
  }
  status.textContent = `Reading the files of revisions ${from} and ${to}…`;
  let wa;
  let wb;
  try {
    [wa, wb] = await Promise.all([from, to].map((r) => api('GET', notebookApi(pid, nid, '/workspace'), { query: { revision: r } })));
  } catch (err) {
    if (err instanceof ApiError && (err.status === 410 || err.status === 404)) {
      status.textContent = err.status === 410
        ? 'One of these revisions was pruned: its files can no longer be read.'
        : 'One of these revisions does not exist.';
    }
    throw err;
  }
  if (ctx.stale()) return;

  const listed = (ws) => new Map(ws.entries.filter((e) => e.kind !== 'dir').map((e) => [e.path, e]));
  const before = listed(wa);
  const after = listed(wb);
  const paths = [...new Set([...before.keys(), ...after.keys()])].sort();
  const candidates = [];
  for (const path of paths) {
    const a = before.get(path);
    const b = after.get(path);
    if (!a) candidates.push({ path, status: 'added', b });
    else if (!b) candidates.push({ path, status: 'removed', a });
    else if (a.kind !== b.kind || a.size !== b.size || a.target !== b.target || Boolean(a.executable) !== Boolean(b.executable)) {
      candidates.push({ path, status: 'changed', a, b });
    } else if (a.kind === 'file' && a.node && b.node) {
      // A file's content node names its bytes: equal nodes, nothing to compare.
      if (a.node !== b.node) candidates.push({ path, status: 'changed', a, b });
    } else if (a.kind === 'file') {
      // Same size and no content node (an older hub): only the contents tell.
      candidates.push({ path, status: 'maybe', a, b });
    }
  }
  const compared = candidates.slice(0, MAX_DIFF_FILES);
  const skipped = candidates.slice(MAX_DIFF_FILES);
  let done = 0;
  const out = [];
  const read = async (entry, rev) => {
    if (!entry || entry.kind !== 'file') return { text: '' };
    if ((entry.size ?? 0) > MAX_DIFF_BYTES) return { tooLarge: true, size: entry.size };
    return fetchContent(fileApiUrl(pid, nid, entry.path, rev), MAX_DIFF_BYTES);
  };
  await eachLimited(compared, FETCH_CONCURRENCY, async (c) => {
    const [oldC, newC] = await Promise.all([read(c.a, from), read(c.b, to)]);
    done += 1;
    if (!ctx.stale()) status.textContent = `Comparing files: ${done} of ${compared.length}…`;
    out.push(fileDiff(c, oldC, newC));
  });
  if (ctx.stale()) return;
  const changed = out.filter(Boolean).sort((x, y) => x.path.localeCompare(y.path));

  const draw = () => {
    fill(results,
      changed.map((r) => diffSection(r, mode)),
      skipped.length ? h('p', { class: 'hint', testid: 'diff-skipped' },
        `${plural(skipped.length, 'more file')} not compared (at most ${MAX_DIFF_FILES} per page): `,
        skipped.map((c) => c.path).slice(0, 50).join(', '), skipped.length > 50 ? '…' : '') : null);
  };
  const adds = changed.reduce((n, r) => n + (r.adds ?? 0), 0);
  const dels = changed.reduce((n, r) => n + (r.dels ?? 0), 0);
  status.textContent = changed.length
    ? `Revision ${from} → ${to}: ${plural(changed.length, 'file')} changed, ${plural(adds, 'line')} added, ${plural(dels, 'line')} removed.`
    : `Revisions ${from} and ${to} have the same files.`;
  draw();
  modes.addEventListener('change', () => {
    mode = modes.querySelector('input:checked')?.value === 'split' ? 'split' : 'unified';
    window.history.replaceState(null, '', diffHref(pid, nid, from, to, mode === 'split' ? 'split' : null));
    draw();
  });
}

/** What changed in one file: null when the contents turn out equal. */
function fileDiff(c, oldC, newC) {
  const base = { path: c.path, status: c.status === 'maybe' ? 'changed' : c.status, oldSize: c.a?.size, newSize: c.b?.size };
  if (c.a?.kind === 'symlink' || c.b?.kind === 'symlink') {
    return { ...base, note: `Link: ${c.a?.target ?? '—'} → ${c.b?.target ?? '—'}` };
  }
  if (oldC.tooLarge || newC.tooLarge) {
    return { ...base, note: `Too large to compare here (over ${formatBytes(MAX_DIFF_BYTES)}).` };
  }
  if (oldC.binary || newC.binary) {
    if (c.status === 'maybe') return { ...base, note: 'Binary file: it may be unchanged (same size); download both revisions to compare.' };
    return { ...base, note: 'Binary file changed.' };
  }
  if (c.status === 'maybe' && oldC.text === newC.text) return null;
  const oldLines = splitLines(oldC.text ?? '');
  const newLines = splitLines(newC.text ?? '');
  if (oldLines.length > MAX_DIFF_LINES || newLines.length > MAX_DIFF_LINES) {
    return { ...base, note: `Too large for a line diff (over ${formatCount(MAX_DIFF_LINES)} lines).` };
  }
  const { ops, approximate } = diffLines(oldLines, newLines);
  const adds = ops.filter((op) => op.t === '+').length;
  const dels = ops.filter((op) => op.t === '-').length;
  if (!adds && !dels) {
    return { ...base, note: c.a && c.b ? 'Only the line ending at the end of the file or the executable bit changed.' : 'Empty file.' };
  }
  return { ...base, hunks: toHunks(ops), adds, dels, approximate };
}

const STATUS_KIND = { added: 'ok', removed: 'warn', changed: 'info' };

function diffSection(r, mode) {
  const counts = r.hunks
    ? h('span', { class: 'diff-counts' }, h('span', { class: 'count-add' }, `+${formatCount(r.adds)}`), ' ', h('span', { class: 'count-del' }, `−${formatCount(r.dels)}`))
    : null;
  let body;
  if (!r.hunks) body = h('p', { class: 'hint', testid: 'diff-note' }, r.note);
  else {
    const rows = r.hunks.reduce((n, hk) => n + hk.ops.length, 0);
    body = [
      r.approximate ? h('p', { class: 'hint' }, 'These versions differ too much for a line-by-line match: the old lines are shown removed and the new ones added.') : null,
      rows > MAX_DIFF_ROWS
        ? h('p', { class: 'hint', testid: 'diff-truncated' }, `This diff has ${formatCount(rows)} lines: only the first ${formatCount(MAX_DIFF_ROWS)} are shown.`)
        : null,
      mode === 'split' ? splitTable(r) : unifiedTable(r),
    ];
  }
  return h('section', { class: 'card diff-file', testid: 'diff-file', data: { path: r.path, status: r.status }, 'aria-label': `${r.status}: ${r.path}` },
    h('h2', { class: 'diff-path' }, h('code', {}, r.path)),
    h('p', { class: 'diff-meta' }, badge(r.status, STATUS_KIND[r.status]), ' ', counts,
      r.oldSize != null && r.newSize != null && r.oldSize !== r.newSize ? h('span', { class: 'hint' }, ` · ${formatBytes(r.oldSize)} → ${formatBytes(r.newSize)}`) : null),
    body);
}

const SR_MARK = { '+': 'Added: ', '-': 'Removed: ', ' ': '' };
const MARK = { '+': '+', '-': '−', ' ': ' ' };
const CLASS = { '+': 'add', '-': 'del', ' ': 'ctx' };
const TESTID = { '+': 'diff-add', '-': 'diff-del', ' ': null };

function limitedOps(r) {
  let left = MAX_DIFF_ROWS;
  const out = [];
  for (const hk of r.hunks) {
    if (left <= 0) break;
    const ops = hk.ops.slice(0, left);
    left -= ops.length;
    out.push({ ...hk, ops });
  }
  return out;
}

function unifiedTable(r) {
  const rows = [];
  for (const hk of limitedOps(r)) {
    rows.push(h('tr', { class: 'hunk' }, h('td', { colspan: 3 }, `@@ -${hk.aStart},${hk.aLen} +${hk.bStart},${hk.bLen} @@`)));
    for (const op of hk.ops) {
      rows.push(h('tr', { class: CLASS[op.t], testid: TESTID[op.t] },
        h('td', { class: 'ln' }, op.a ?? ''),
        h('td', { class: 'ln' }, op.b ?? ''),
        h('td', { class: 'code-cell' },
          h('span', { class: 'marker', 'aria-hidden': 'true' }, MARK[op.t]),
          SR_MARK[op.t] ? h('span', { class: 'visually-hidden' }, SR_MARK[op.t]) : null,
          op.text)));
    }
  }
  return dataTable({
    testid: 'diff-table',
    caption: `Changes to ${r.path}`,
    className: 'diff unified',
    head: [h('th', { scope: 'col', class: 'ln' }, 'Old'), h('th', { scope: 'col', class: 'ln' }, 'New'), 'Line'],
    rows,
  });
}

function splitTable(r) {
  const rows = [];
  const side = (op, t) => (op
    ? [h('td', { class: 'ln' }, t === '+' ? op.b : op.a),
      h('td', { class: `code-cell ${CLASS[op.t]}`, testid: TESTID[op.t] },
        h('span', { class: 'marker', 'aria-hidden': 'true' }, MARK[op.t]),
        SR_MARK[op.t] ? h('span', { class: 'visually-hidden' }, SR_MARK[op.t]) : null,
        op.text)]
    : [h('td', { class: 'ln empty' }), h('td', { class: 'code-cell empty' })]);
  for (const hk of limitedOps(r)) {
    rows.push(h('tr', { class: 'hunk' }, h('td', { colspan: 4 }, `@@ -${hk.aStart},${hk.aLen} +${hk.bStart},${hk.bLen} @@`)));
    const ops = hk.ops;
    let i = 0;
    while (i < ops.length) {
      if (ops[i].t === ' ') {
        const op = ops[i];
        rows.push(h('tr', { class: 'ctx' },
          h('td', { class: 'ln' }, op.a), h('td', { class: 'code-cell ctx' }, h('span', { class: 'marker', 'aria-hidden': 'true' }, ' '), op.text),
          h('td', { class: 'ln' }, op.b), h('td', { class: 'code-cell ctx' }, h('span', { class: 'marker', 'aria-hidden': 'true' }, ' '), op.text)));
        i += 1;
        continue;
      }
      const dels = [];
      const adds = [];
      while (i < ops.length && ops[i].t !== ' ') {
        (ops[i].t === '-' ? dels : adds).push(ops[i]);
        i += 1;
      }
      for (let k = 0; k < Math.max(dels.length, adds.length); k += 1) {
        rows.push(h('tr', { class: 'change' }, side(dels[k], '-'), side(adds[k], '+')));
      }
    }
  }
  return dataTable({
    testid: 'diff-table',
    caption: `Changes to ${r.path}, side by side`,
    className: 'diff split',
    head: [h('th', { scope: 'col', class: 'ln' }, 'Old'), 'Before', h('th', { scope: 'col', class: 'ln' }, 'New'), 'After'],
    rows,
  });
}
