// File contents: the files of a revision, one file's text with line numbers (or a download
// link for binary and large files), and the revision picker the diff page shares.

import { ApiError, field, fill, formatBytes, formatCount, h, loading, plural } from './common.js';
import { fileHref, filesHref, navigate } from './nav.js';
import { api, fetchContent, fileApiUrl, notebookApi, PAGE_LIMIT, rethrow401 } from './api.js';
import { filesTable, loadNotebook, notebookFrame } from './notebook.js';

// A file page shows text files up to this size; larger or binary files get a download link.
const MAX_VIEW_BYTES = 2 * 1024 * 1024;
// Line numbers are drawn per line up to this many lines.
const MAX_NUMBERED_LINES = 20000;

export function splitLines(text) {
  if (text === '') return [];
  const lines = text.split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  return lines;
}

/** Text with line numbers (drawn by CSS, so copying the text leaves them out). */
function codeView(text, label) {
  const lines = splitLines(text);
  if (lines.length > MAX_NUMBERED_LINES) {
    return [
      h('p', { class: 'hint' }, `${plural(lines.length, 'line')}: shown without line numbers.`),
      h('pre', { class: 'code', testid: 'file-content', tabindex: 0, role: 'region', 'aria-label': label }, text),
    ];
  }
  const pre = h('pre', { class: 'code numbered', testid: 'file-content', tabindex: 0, role: 'region', 'aria-label': label });
  const frag = document.createDocumentFragment();
  for (const line of lines) frag.append(h('span', { class: 'line' }, `${line}\n`));
  pre.append(frag);
  return pre;
}

export async function fileView(ctx) {
  const { pid, nid, segments, params } = ctx;
  const path = segments.slice(5).join('/');
  const revParam = params.get('rev');
  const rev = /^\d+$/.test(revParam ?? '') ? Number(revParam) : null;
  const frame = notebookFrame('file-title');
  const [project, nb] = await loadNotebook(ctx);
  if (ctx.stale()) return;
  const revLabel = rev != null ? `revision ${formatCount(rev)}` : `the head (revision ${nb.head_revision ?? '—'})`;
  if (path) {
    frame.set(project, nb, { title: path, crumb: path.split('/').pop(), crumbHref: [`Files at ${revLabel}`, filesHref(pid, nid, rev)] });
  } else {
    frame.set(project, nb, { title: `Files at ${revLabel}`, crumb: 'Files' });
  }

  const versionsPage = await api('GET', notebookApi(pid, nid, '/versions'), { query: { limit: PAGE_LIMIT } }).catch(rethrow401({ items: [] }));
  if (ctx.stale()) return;
  const picker = revisionPicker(versionsPage.items ?? [], rev, nb.head_revision, 'rev-picker', 'Revision', true);
  const pickForm = h('form', { class: 'filters', testid: 'rev-form' },
    picker,
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'secondary', testid: 'rev-submit' }, 'Show')));
  pickForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const chosen = picker.querySelector('select').value;
    const to = chosen === '' ? null : Number(chosen);
    navigate(path ? fileHref(pid, nid, path, to) : filesHref(pid, nid, to));
  });
  const content = h('div', {}, loading(path ? 'Loading the file…' : 'Loading the files…'));
  fill(frame.body, pickForm, content);

  if (nb.head_revision == null && rev == null) {
    fill(content, h('p', { class: 'empty' }, 'This notebook has no revision yet.'));
    return;
  }
  if (!path) {
    try {
      const ws = await api('GET', notebookApi(pid, nid, '/workspace'), { query: { revision: rev }, main: true });
      if (ctx.stale()) return;
      fill(content, filesTable(pid, nid, ws.entries, rev));
    } catch (err) {
      if (err.status === 410) {
        fill(content, prunedMessage(rev));
        return;
      }
      throw err;
    }
    return;
  }

  const url = fileApiUrl(pid, nid, path, rev);
  const name = path.split('/').pop();
  const download = h('a', { href: url, download: name, testid: 'file-download', class: 'button secondary' }, 'Download');
  let result;
  try {
    result = await fetchContent(url, MAX_VIEW_BYTES);
  } catch (err) {
    if (err instanceof ApiError && err.status === 410) {
      fill(content, prunedMessage(rev));
      return;
    }
    if (err instanceof ApiError) err.main = true;
    throw err;
  }
  if (ctx.stale()) return;
  const meta = h('div', { class: 'toolbar' },
    h('span', { class: 'listing-meta', testid: 'file-meta' }, result.size != null ? formatBytes(result.size) : '', ` · at ${revLabel}`),
    download);
  if (result.tooLarge) {
    fill(content, meta, h('p', { class: 'empty', testid: 'file-too-large' },
      `This file is too large to show here (${result.size != null ? formatBytes(result.size) : `over ${formatBytes(MAX_VIEW_BYTES)}`}): download it instead.`));
  } else if (result.binary) {
    fill(content, meta, h('p', { class: 'empty', testid: 'file-binary' }, 'This file is not text: download it instead.'));
  } else {
    fill(content, meta, codeView(result.text, `Contents of ${path}`));
  }
}

function prunedMessage(rev) {
  return h('p', { class: 'empty', testid: 'pruned-message' },
    `Revision ${rev ?? ''} was pruned by the retention policy: its files can no longer be read.`);
}

/** A labelled <select> of revisions (kept ones selectable); '' stands for the head when `withHead`. */
export function revisionPicker(versions, selected, head, testid, label, withHead) {
  const select = h('select', { name: testid, testid });
  if (withHead) select.append(h('option', { value: '' }, `Head (revision ${head ?? '—'})`));
  const seen = new Set();
  for (const v of versions) {
    seen.add(v.revision);
    select.append(h('option', { value: String(v.revision), disabled: v.state === 'pruned' },
      `Revision ${v.revision} · ${v.kind}${v.state === 'pruned' ? ' (pruned)' : ''}${v.message ? ` · ${v.message.slice(0, 60)}` : ''}`));
  }
  if (selected != null && !seen.has(selected)) select.append(h('option', { value: String(selected) }, `Revision ${selected}`));
  select.value = selected != null ? String(selected) : (withHead ? '' : select.options[0]?.value ?? '');
  return field(label, select);
}
