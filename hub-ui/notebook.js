// A notebook's page (facts, actions, fork, details, sync setup, the files at the head, the
// history with compare and restore), and what the pages below it share: their frame, loading
// the project and notebook, and the files table.

import {
  bytes, dataTable, field, fill, formatCount, h, hiddenTh, loading, numTh, uid
} from './common.js';
import { takeFreshSyncToken } from './state.js';
import { diffHref, enc, fileHref, filesHref, navigate, notebookHref, projectHref } from './nav.js';
import {
  announce, breadcrumbs, busy, clearAlert, confirmDialog, copyBlock, handleSubmit, loadMoreButton,
  mount, setTitle, showError, toast
} from './dom.js';
import { atLeast, badge, isGit, sourceText, statusBadge, tagList, time } from './format.js';
import {
  allPages, api, feature, notebookApi, PAGE_LIMIT, person, projectApi, resolveUsers, rethrow401,
  system
} from './api.js';
import { countLiveSessions, parseTags } from './projects.js';

const NOTEBOOK_STATUSES = ['draft', 'active', 'archived'];

/* ------------------------------------------------------------------------------------------ */
/* Notebook pages: shared frame                                                                */
/* ------------------------------------------------------------------------------------------ */

/**
 * The frame of a notebook page: breadcrumb and heading (the notebook's title on its own page,
 * `heading` on the pages below it), filled once the project and notebook are read.
 */
export function notebookFrame(testid = 'notebook-title') {
  const crumbs = h('div', {}, breadcrumbs([['Projects', '/'], ['…', null]]));
  const heading = h('h1', { tabindex: -1, testid, class: 'page-title' }, 'Loading notebook…');
  const body = h('div', { class: 'stack' }, loading());
  mount(crumbs, heading, body);
  return {
    body,
    heading,
    set(project, nb, { title, crumb, crumbHref } = {}) {
      const trail = [['Projects', '/'], [project.name, projectHref(project.id)]];
      if (crumb) {
        trail.push([nb.title, notebookHref(project.id, nb.id)]);
        if (crumbHref) trail.push([crumbHref[0], crumbHref[1]]);
        trail.push([crumb, null]);
      } else {
        trail.push([nb.title, null]);
      }
      fill(crumbs, breadcrumbs(trail));
      heading.textContent = title ?? nb.title;
      setTitle(crumb, nb.title, project.name);
    },
  };
}

export async function loadNotebook(ctx) {
  const { pid, nid } = ctx;
  return Promise.all([
    api('GET', projectApi(pid), { main: true }),
    api('GET', notebookApi(pid, nid), { main: true }),
    system(),
  ]);
}

/* ------------------------------------------------------------------------------------------ */
/* A notebook: facts, actions, sync setup, files at the head, history                          */
/* ------------------------------------------------------------------------------------------ */

export async function notebookView(ctx) {
  const { pid, nid } = ctx;
  const frame = notebookFrame();
  const [project, first, sys] = await loadNotebook(ctx);
  if (ctx.stale()) return;
  let nb = first;
  frame.set(project, nb);
  const editor = atLeast(project.role, 'editor');
  const manager = atLeast(project.role, 'manager');
  const sessionsOn = feature(sys, 'sessions');

  let versions = [];
  let versionsCursor = null;
  let workspace = null;
  let liveSessions = 0;
  let claim = null;
  const compare = { from: null, to: null };

  const infoArea = h('section', { class: 'card', 'aria-labelledby': 'about-heading', testid: 'notebook-info' });
  const actionsArea = h('div');
  const syncArea = h('div');
  const filesArea = h('div', {}, loading('Loading files…'));
  const historyArea = h('div', {}, loading('Loading history…'));
  const moreVersions = loadMoreButton('Load older revisions', 'versions-more', () => loadVersions(versionsCursor));
  const compareButton = h('button', { type: 'button', class: 'secondary', testid: 'compare-button', onclick: () => openCompare() }, 'Compare selected revisions');

  fill(frame.body,
    infoArea,
    actionsArea,
    syncArea,
    h('section', { class: 'stack', 'aria-labelledby': 'files-heading' },
      h('h2', { id: 'files-heading' }, 'Files'),
      filesArea),
    h('section', { class: 'stack', 'aria-labelledby': 'history-heading' },
      h('h2', { id: 'history-heading', tabindex: -1 }, 'History'),
      h('p', { class: 'hint' }, 'Newest first. Choose a “from” and a “to” revision to compare them, or compare a revision with the one before it.'),
      h('div', { class: 'toolbar' }, compareButton),
      historyArea,
      h('div', { class: 'pager' }, moreVersions)));

  function drawInfo() {
    const facts = [
      ['Status', statusBadge(nb.status, 'notebook-status')],
      ['Head revision', h('span', { testid: 'notebook-head' }, nb.head_revision != null ? formatCount(nb.head_revision) : 'none yet')],
      ['Source', h('span', { testid: 'notebook-source', data: { source: nb.source?.type } }, sourceText(nb.source))],
      nb.source?.entry_notebook ? ['Notebook file', h('code', {}, nb.source.entry_notebook)] : null,
      ['Tags', tagList(nb.tags)],
      ['Author', person(nb.author)],
      ['Created', time(nb.created_at)],
      ['Last save', time(nb.updated_at, 'notebook-updated')],
      sessionsOn ? ['Active sessions', h('span', { testid: 'active-sessions' }, formatCount(liveSessions))] : null,
      sessionsOn && claim?.session_id
        ? ['Editor', h('span', { testid: 'editor-holder' }, 'open by ', person(claim.user_id), claim.claimed_at ? [' since ', time(claim.claimed_at)] : null)]
        : null,
    ].filter(Boolean);
    fill(infoArea,
      h('h2', { id: 'about-heading', class: 'visually-hidden' }, 'About this notebook'),
      nb.description ? h('p', { class: 'description', testid: 'notebook-description' }, nb.description) : null,
      h('dl', { class: 'facts' }, facts.map(([dt, dd]) => [h('dt', {}, dt), h('dd', {}, dd)])));
  }

  function drawActions() {
    const buttons = [];
    if (editor && sessionsOn) {
      buttons.push(h('a', { class: 'button', href: notebookHref(pid, nid, 'edit'), testid: 'open-editor' }, 'Open editor'));
    }
    if (sessionsOn && feature(sys, 'app_pools') && nb.head_revision != null) {
      buttons.push(h('a', { class: 'button secondary', href: notebookHref(pid, nid, 'app'), testid: 'run-app' }, 'Run as app'));
    }
    buttons.push(h('a', {
      class: 'button secondary',
      href: `/api/v1${notebookApi(pid, nid, '/export')}`,
      download: '',
      testid: 'export-link',
      onclick: () => toast('Exporting: the archive of every kept revision downloads in your browser.'),
    }, 'Export archive'));
    let deleteButton = null;
    if (manager) {
      deleteButton = h('button', { type: 'button', class: 'danger', testid: 'delete-notebook', onclick: () => trash(deleteButton) }, 'Move to trash…');
      buttons.push(deleteButton);
    }
    fill(actionsArea, h('section', { class: 'card', 'aria-labelledby': 'actions-heading', testid: 'notebook-actions' },
      h('h2', { id: 'actions-heading' }, 'Actions'),
      h('div', { class: 'actions' }, buttons),
      editor && isGit(nb.source) && sessionsOn
        ? h('p', { class: 'hint' }, 'This notebook changes only by push sync: what you change in the editor is not saved. Fork it to edit it here.')
        : null,
      editor && nb.head_revision != null ? forkForm() : null,
      editor ? detailsForm() : null));
  }

  function forkForm() {
    const title = h('input', { name: 'new_title', required: true, maxlength: 200, autocomplete: 'off', value: `${nb.title} (fork)`, testid: 'fork-title' });
    const form = h('form', { class: 'inline-form-block', testid: 'fork-form', 'aria-labelledby': 'fork-heading' },
      h('h3', { id: 'fork-heading' }, 'Fork'),
      h('p', { class: 'hint' }, 'Copies the head revision into a new notebook of this project (its revision 1).'),
      h('div', { class: 'form-row align-end' },
        field('Title of the copy', title),
        h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'secondary', testid: 'fork-submit' }, 'Fork'))));
    handleSubmit(form, async () => {
      const created = await api('POST', notebookApi(pid, nid, '/fork'), { json: { new_title: title.value.trim() } });
      toast(`Forked into “${created.notebook.title}”.`);
      navigate(notebookHref(pid, created.notebook.id));
    }, 'Forking…');
    return form;
  }

  function detailsForm() {
    const title = h('input', { name: 'title', required: true, maxlength: 200, value: nb.title, testid: 'edit-title' });
    const description = h('textarea', { name: 'description', rows: 2, value: nb.description ?? '', testid: 'edit-description' });
    const tags = h('input', { name: 'tags', value: (nb.tags ?? []).join(', '), testid: 'edit-tags' });
    const status = h('select', { name: 'status', testid: 'edit-status', value: nb.status },
      NOTEBOOK_STATUSES.map((st) => h('option', { value: st }, st)));
    const form = h('form', { testid: 'details-form' },
      field('Title', title),
      field('Description', description),
      field('Tags', tags, 'Comma-separated.'),
      field('Status', status),
      h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'secondary', testid: 'details-submit' }, 'Save details')));
    handleSubmit(form, async () => {
      nb = await api('PATCH', notebookApi(pid, nid), {
        json: { title: title.value.trim(), description: description.value.trim(), tags: parseTags(tags.value), status: status.value },
      });
      frame.set(project, nb);
      drawInfo();
      toast('Details saved.');
    }, 'Saving…');
    return h('details', { class: 'disclosure-block' }, h('summary', {}, 'Edit details'), form);
  }

  async function trash(button) {
    const ok = await confirmDialog({
      title: `Move ${nb.title} to the trash?`,
      message: 'The notebook and its whole history move to the project\'s trash, where a manager can restore or purge it.',
      confirmLabel: 'Move to trash',
      danger: true,
    });
    if (!ok) return;
    clearAlert();
    try {
      await busy(button, 'Moving to the trash…', () => api('DELETE', notebookApi(pid, nid)));
      toast(`“${nb.title}” moved to the trash.`);
      navigate(projectHref(pid));
    } catch (err) {
      showError(err);
    }
  }

  function drawSync() {
    if (!isGit(nb.source)) {
      fill(syncArea);
      return;
    }
    fill(syncArea, syncSection(project, nb, manager));
  }

  function drawFiles() {
    if (nb.head_revision == null) {
      fill(filesArea, h('p', { class: 'empty', testid: 'files-empty' }, isGit(nb.source)
        ? 'No revision yet: the first push sync makes one.'
        : 'No revision yet: open the editor, or save through the API, to make the first one.'));
      return;
    }
    if (!workspace) {
      fill(filesArea, h('p', { class: 'empty' }, 'The files of the head revision could not be loaded.'));
      return;
    }
    fill(filesArea,
      h('p', { class: 'listing-meta' }, `At revision ${formatCount(workspace.version?.revision ?? nb.head_revision)}.`),
      filesTable(pid, nid, workspace.entries, null));
  }

  function drawHistory() {
    if (!versions.length) {
      fill(historyArea, h('p', { class: 'empty', testid: 'history-empty' }, 'No revisions yet.'));
      compareButton.hidden = true;
      moreVersions.hidden = true;
      return;
    }
    const kept = versions.filter((v) => v.state !== 'pruned');
    if (compare.to == null && kept[0]) compare.to = kept[0].revision;
    if (compare.from == null && kept[1]) compare.from = kept[1].revision;
    compareButton.hidden = kept.length < 2;
    const fromName = uid('compare-from');
    const toName = uid('compare-to');
    fill(historyArea, dataTable({
      testid: 'history-table',
      caption: 'Revisions, newest first',
      className: 'history',
      head: ['From', 'To', numTh('Revision'), 'Kind', 'Author', 'Saved', 'Message', numTh('Size'), hiddenTh('Actions')],
      rows: versions.map((v, i) => {
        const pruned = v.state === 'pruned';
        const previous = v.parent_revision ?? versions.slice(i + 1).find((p) => p.state !== 'pruned')?.revision ?? null;
        const radio = (name, which, testid) => h('input', {
          type: 'radio',
          name,
          value: String(v.revision),
          testid,
          checked: compare[which] === v.revision,
          disabled: pruned,
          'aria-label': `Compare ${which} revision ${v.revision}`,
          onchange: () => { compare[which] = v.revision; },
        });
        const actions = [];
        if (!pruned) {
          actions.push(h('a', { href: filesHref(pid, nid, v.revision), testid: 'version-files', 'aria-label': `Files of revision ${v.revision}` }, 'Files'));
          if (previous != null) {
            actions.push(h('a', { href: diffHref(pid, nid, previous, v.revision), testid: 'version-diff', 'aria-label': `Changes of revision ${v.revision} from revision ${previous}` }, 'Changes'));
          }
          if (editor && !v.is_head && !isGit(nb.source)) {
            const restore = h('button', {
              type: 'button',
              class: 'secondary small',
              testid: 'version-restore',
              'aria-label': `Restore revision ${v.revision}`,
            }, 'Restore');
            restore.addEventListener('click', () => restoreVersion(restore, v));
            actions.push(restore);
          }
        }
        return h('tr', {
          testid: 'version-row',
          class: pruned ? 'pruned' : null,
          data: { revision: v.revision, kind: v.kind, state: v.state, head: String(Boolean(v.is_head)), versionId: v.version_id },
        },
        h('td', {}, radio(fromName, 'from', 'compare-from')),
        h('td', {}, radio(toName, 'to', 'compare-to')),
        h('th', { scope: 'row', class: 'num', testid: 'version-revision' }, formatCount(v.revision),
          v.is_head ? [' ', badge('head', 'ok', 'version-head')] : null),
        h('td', {}, badge(v.kind, 'kind', 'version-kind'), pruned ? [' ', badge('pruned', 'warn', 'version-pruned')] : null),
        h('td', {}, person(v.author, 'version-author')),
        h('td', {}, time(v.saved_at)),
        h('td', { class: 'wrap message', testid: 'version-message' }, v.message || h('span', { class: 'hint' }, '—')),
        h('td', { class: 'num' }, bytes(v.size_bytes)),
        h('td', {}, h('div', { class: 'row-actions' }, actions)));
      }),
    }));
    moreVersions.hidden = !versionsCursor;
  }

  function openCompare() {
    if (compare.from == null || compare.to == null) {
      showError(new Error('Choose a “from” and a “to” revision first.'));
      return;
    }
    if (compare.from === compare.to) {
      showError(new Error('Choose two different revisions to compare.'));
      return;
    }
    navigate(diffHref(pid, nid, compare.from, compare.to));
  }

  async function restoreVersion(button, v) {
    clearAlert();
    try {
      const done = await busy(button, 'Restoring…', () => api('POST', notebookApi(pid, nid, `/versions/${enc(v.version_id)}/restore`), {
        json: { expected_revision: nb.head_revision },
      }));
      if (ctx.stale()) return;
      compare.from = null;
      compare.to = null;
      await refresh();
      document.getElementById('history-heading')?.focus();
      toast(`Revision ${v.revision} restored as revision ${done?.revision ?? 'new'}.`);
      announce(`Revision ${v.revision} restored as the new head revision ${done?.revision ?? ''}.`);
    } catch (err) {
      showError(err);
    }
  }

  async function loadVersions(from) {
    const page = await api('GET', notebookApi(pid, nid, '/versions'), { query: { limit: PAGE_LIMIT, cursor: from } });
    if (ctx.stale()) return;
    await resolveUsers((page.items ?? []).map((v) => v.author));
    versions = from ? versions.concat(page.items ?? []) : (page.items ?? []);
    versionsCursor = page.next_cursor ?? null;
    drawHistory();
  }

  /** Reads everything (again, after a restore): the notebook, its head's files, its history. */
  async function refresh(known = null) {
    const [n, sessions, cl] = await Promise.all([
      known ?? api('GET', notebookApi(pid, nid), { main: true }),
      sessionsOn ? allPages(projectApi(pid, '/sessions')).catch(rethrow401([])) : [],
      sessionsOn ? api('GET', notebookApi(pid, nid, '/editor-session')).catch(rethrow401(null)) : null,
    ]);
    if (ctx.stale()) return;
    nb = n;
    liveSessions = countLiveSessions(sessions).get(nid) ?? 0;
    claim = cl;
    await resolveUsers([nb.author, claim?.user_id]);
    workspace = nb.head_revision != null
      ? await api('GET', notebookApi(pid, nid, '/workspace')).catch(rethrow401(null))
      : null;
    if (ctx.stale()) return;
    frame.set(project, nb);
    drawInfo();
    drawActions();
    drawSync();
    drawFiles();
    await loadVersions(null);
  }

  await refresh(first);
}

/** Files of a workspace listing, each a link to its page at `rev` (head when null). */
export function filesTable(pid, nid, entries, rev) {
  const files = (entries ?? []).filter((e) => e.kind !== 'dir');
  if (!files.length) return h('p', { class: 'empty', testid: 'files-empty' }, 'This revision has no files.');
  return dataTable({
    testid: 'files-table',
    caption: rev != null ? `Files at revision ${rev}` : 'Files at the head revision',
    head: ['Path', numTh('Size')],
    rows: files.map((e) => h('tr', { testid: 'file-row', data: { path: e.path } },
      h('th', { scope: 'row', class: 'wrap' },
        e.kind === 'symlink'
          ? [h('code', {}, e.path), h('span', { class: 'hint' }, ` → ${e.target ?? ''} (link)`)]
          : h('a', { href: fileHref(pid, nid, e.path, rev), testid: 'file-link', data: { path: e.path } }, h('code', {}, e.path)),
        e.executable ? [' ', badge('executable')] : null),
      h('td', { class: 'num' }, e.kind === 'file' ? bytes(e.size) : '—'))),
  });
}

function syncSection(project, nb, manager) {
  const origin = window.location.origin;
  const tokenArea = h('div', { 'aria-live': 'polite' });
  const showToken = (token) => {
    fill(tokenArea,
      h('p', { class: 'warn', testid: 'sync-token-note' }, 'Copy the sync token now: it is shown only this once. Store it as the repository secret UNICAS_SYNC_TOKEN.'),
      copyBlock(token, { testid: 'sync-token', label: 'Sync token', copyTestid: 'copy-sync-token', done: 'Sync token copied.' }));
  };
  const fresh = takeFreshSyncToken(nb.id);
  if (fresh) showToken(fresh.token);
  const branch = nb.source?.branch || 'main';
  const curl = [
    'git archive --format=tar HEAD | curl --fail-with-body -X POST \\',
    `  "${origin}/api/sync/git/v1" \\`,
    '  -H "Authorization: Bearer $UNICAS_SYNC_TOKEN" \\',
    '  -H "Content-Type: application/x-tar" \\',
    '  -H "X-Sync-Commit: $(git rev-parse HEAD)" \\',
    '  -H "X-Sync-Message: $(git log -1 --format=%s)" \\',
    '  --data-binary @-',
  ].join('\n');
  const actions = [
    '# .github/workflows/unicas-hub-sync.yml',
    'name: Sync to the UniCAS hub',
    'on:',
    '  push:',
    `    branches: [${branch}]`,
    'jobs:',
    '  sync:',
    '    runs-on: ubuntu-latest',
    '    steps:',
    '      - uses: actions/checkout@v4',
    '      - name: Push the tree to the hub',
    '        env:',
    '          UNICAS_SYNC_TOKEN: ${{ secrets.UNICAS_SYNC_TOKEN }}',
    '        run: |',
    '          git archive --format=tar HEAD | curl --fail-with-body -X POST \\',
    `            "${origin}/api/sync/git/v1" \\`,
    '            -H "Authorization: Bearer $UNICAS_SYNC_TOKEN" \\',
    '            -H "Content-Type: application/x-tar" \\',
    '            -H "X-Sync-Commit: $GITHUB_SHA" \\',
    '            -H "X-Sync-Message: $(git log -1 --format=%s | head -c 200)" \\',
    '            --data-binary @-',
  ].join('\n');
  let rotate = null;
  if (manager) {
    rotate = h('button', { type: 'button', class: 'secondary', testid: 'rotate-sync-token' }, 'Create a new sync token…');
    rotate.addEventListener('click', async () => {
      const ok = await confirmDialog({
        title: 'Create a new sync token?',
        message: 'The current sync token stops working at once: update the secret of every workflow that pushes this notebook.',
        confirmLabel: 'Create new token',
        danger: true,
      });
      if (!ok) return;
      clearAlert();
      try {
        const answer = await busy(rotate, 'Creating…', () => api('POST', notebookApi(project.id, nb.id, '/sync-token')));
        showToken(answer.sync_token);
        tokenArea.querySelector('pre')?.focus();
      } catch (err) {
        showError(err);
      }
    });
  }
  return h('section', { class: 'card', 'aria-labelledby': 'sync-heading', testid: 'sync-setup' },
    h('h2', { id: 'sync-heading' }, 'Sync setup'),
    h('p', {}, 'A workflow pushes the complete tree of each commit as a tar archive; every push becomes a new revision. The notebook\'s sync token authorizes the push (it reaches nothing else).'),
    tokenArea,
    manager
      ? h('div', { class: 'actions' }, rotate)
      : h('p', { class: 'hint' }, 'A manager of the project creates the sync token.'),
    h('h3', {}, 'Push from a shell'),
    copyBlock(curl, { testid: 'sync-curl', label: 'Command', copyTestid: 'copy-sync-curl', done: 'Command copied.' }),
    h('h3', {}, 'Push from GitHub Actions'),
    copyBlock(actions, { testid: 'sync-actions', label: 'Workflow', copyTestid: 'copy-sync-actions', done: 'Workflow copied.' }));
}
