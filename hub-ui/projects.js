// The projects page (your projects, a new project, projects in the trash), the frame every
// project page shares (breadcrumb, heading, section tabs) and a project's notebooks page
// (search, live sessions, a new notebook, importing an archive).

import {
  ApiError, dataTable, field, fill, formatCount, h, hiddenTh, loading, numTh, plural, uid
} from './common.js';
import { setFreshSyncToken } from './state.js';
import { enc, navigate, notebookHref, projectHref } from './nav.js';
import {
  announce, breadcrumbs, busy, clearAlert, handleSubmit, loadMoreButton, mount, setTitle,
  showError, toast
} from './dom.js';
import { atLeast, badge, isGit, roleName, statusBadge, tagList, time } from './format.js';
import {
  allPages, api, feature, PAGE_LIMIT, projectApi, system, uploadWithProgress
} from './api.js';

/* ------------------------------------------------------------------------------------------ */
/* Projects                                                                                    */
/* ------------------------------------------------------------------------------------------ */

export async function projectsView(ctx) {
  setTitle('Projects');
  let items = [];
  let cursor = null;
  const list = h('div', {}, loading('Loading projects…'));
  const more = loadMoreButton('Load more projects', 'projects-more', () => load(cursor));
  const trashArea = h('div');
  mount(
    h('h1', { tabindex: -1 }, 'Projects'),
    h('section', { class: 'stack', 'aria-labelledby': 'projects-heading' },
      h('h2', { id: 'projects-heading', class: 'visually-hidden' }, 'Your projects'),
      list,
      h('div', { class: 'pager' }, more)),
    newProjectForm(),
    trashArea,
  );

  const draw = () => {
    fill(list, items.length ? dataTable({
      testid: 'projects-table',
      caption: 'Projects you can see',
      head: ['Project', numTh('Notebooks'), numTh('Members'), 'Your role', 'Updated'],
      rows: items.map((p) => h('tr', { testid: 'project-row', data: { projectId: p.id } },
        h('th', { scope: 'row', class: 'wrap' },
          h('a', { href: projectHref(p.id), testid: 'project-link', data: { projectId: p.id } }, p.name || p.id),
          p.description ? h('div', { class: 'hint row-hint' }, p.description) : null),
        h('td', { class: 'num', testid: 'project-notebooks' }, formatCount(p.notebook_count)),
        h('td', { class: 'num', testid: 'project-members' }, formatCount(p.members?.length)),
        h('td', { testid: 'project-your-role' }, badge(roleName(p.role))),
        h('td', {}, time(p.updated_at)))),
    }) : h('p', { class: 'empty', testid: 'projects-empty' }, 'No projects yet: create the first one below.'));
    more.hidden = !cursor;
  };

  async function load(from) {
    const page = await api('GET', '/projects', { query: { limit: PAGE_LIMIT, cursor: from } });
    if (ctx.stale()) return;
    items = items.concat(page.items ?? []);
    cursor = page.next_cursor ?? null;
    draw();
    announce(`${plural(items.length, 'project')} shown.`);
  }

  await load(null);
  // Projects in the trash that the caller manages: restorable until the maintenance pass.
  try {
    const trashed = await api('GET', '/projects/trash');
    if (!ctx.stale() && trashed?.length) fill(trashArea, trashedProjects(trashed));
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) throw err;
  }
}

function trashedProjects(initial) {
  let items = initial;
  const section = h('section', { class: 'stack', 'aria-labelledby': 'trashed-projects-heading' });
  const draw = () => {
    fill(section,
      h('h2', { id: 'trashed-projects-heading' }, 'Projects in the trash'),
      h('p', { class: 'hint' }, 'Deleted projects you manage. They can be restored with everything they held until they are purged.'),
      items.length ? dataTable({
        testid: 'trashed-projects-table',
        caption: 'Projects in the trash',
        head: ['Project', numTh('Notebooks'), 'Deleted', 'Purged after', hiddenTh('Actions')],
        rows: items.map((p) => h('tr', { testid: 'trashed-project-row', data: { projectId: p.id } },
          h('th', { scope: 'row', class: 'wrap' }, p.name),
          h('td', { class: 'num' }, formatCount(p.notebook_count)),
          h('td', {}, time(p.deleted_at)),
          h('td', {}, p.purge_after ? time(p.purge_after) : 'never'),
          h('td', {}, h('button', {
            type: 'button',
            class: 'secondary small',
            testid: 'trashed-project-restore',
            'aria-label': `Restore project ${p.name}`,
            onclick: (event) => restore(event.currentTarget, p),
          }, 'Restore')))),
      }) : h('p', { class: 'empty' }, 'The trash is empty.'));
  };
  const restore = async (button, p) => {
    clearAlert();
    try {
      await busy(button, 'Restoring…', () => api('POST', projectApi(p.id, '/restore')));
      toast(`Project “${p.name}” restored.`);
      navigate(projectHref(p.id));
    } catch (err) {
      showError(err);
    }
  };
  draw();
  return section;
}

function newProjectForm() {
  const name = h('input', { name: 'name', required: true, maxlength: 200, autocomplete: 'off', testid: 'new-project-name' });
  const description = h('textarea', { name: 'description', rows: 2, testid: 'new-project-description' });
  const form = h('form', { class: 'card', testid: 'new-project-form', 'aria-labelledby': 'new-project-heading' },
    h('h2', { id: 'new-project-heading' }, 'New project'),
    h('p', { class: 'hint' }, 'You become the project\'s owner and can add members afterwards.'),
    field('Name', name),
    field('Description (optional)', description),
    h('div', { class: 'actions' }, h('button', { type: 'submit', testid: 'new-project-submit' }, 'Create project')));
  handleSubmit(form, async () => {
    const project = await api('POST', '/projects', {
      json: { name: name.value.trim(), description: description.value.trim() },
    });
    toast(`Project “${project.name}” created.`);
    navigate(projectHref(project.id));
  }, 'Creating…');
  return form;
}

/* ------------------------------------------------------------------------------------------ */
/* Project pages: shared frame                                                                 */
/* ------------------------------------------------------------------------------------------ */

const PROJECT_SECTIONS = [
  ['', 'Notebooks', null],
  ['trash', 'Trash', null],
  ['storage', 'Storage', null],
  ['settings', 'Settings', 'manager'],
];

/**
 * The frame of a project page: breadcrumb, the project's name as the page heading and its
 * sections; `setProject` fills them once the project is read.
 */
export function projectFrame(tab, label) {
  const crumbs = h('div', {}, breadcrumbs([['Projects', '/'], ['…', null]]));
  const heading = h('h1', { tabindex: -1, testid: 'project-title', class: 'page-title' }, 'Loading project…');
  const meta = h('div', { class: 'page-meta' });
  const tabs = h('div');
  const body = h('div', { class: 'stack' }, loading());
  mount(crumbs, heading, meta, tabs, body);
  return {
    body,
    setProject(p) {
      setTitle(label, p.name);
      fill(crumbs, breadcrumbs(tab
        ? [['Projects', '/'], [p.name, projectHref(p.id)], [label, null]]
        : [['Projects', '/'], [p.name, null]]));
      heading.textContent = p.name;
      fill(meta,
        h('span', {}, 'Your role: ', badge(roleName(p.role), null, 'project-role')),
        p.description ? h('p', { class: 'description', testid: 'project-description' }, p.description) : null);
      fill(tabs, h('nav', { class: 'tabs', 'aria-label': 'Project sections' },
        h('ul', {}, PROJECT_SECTIONS
          .filter(([, , min]) => !min || atLeast(p.role, min))
          .map(([t, text]) => h('li', {}, h('a', {
            href: projectHref(p.id, t),
            testid: `tab-${t || 'notebooks'}`,
            'aria-current': t === tab ? 'page' : null,
          }, text))))));
    },
  };
}

/* ------------------------------------------------------------------------------------------ */
/* A project's notebooks                                                                       */
/* ------------------------------------------------------------------------------------------ */

export async function projectView(ctx) {
  const { pid } = ctx;
  const frame = projectFrame('', 'Notebooks');
  const [project, sys] = await Promise.all([api('GET', projectApi(pid), { main: true }), system()]);
  if (ctx.stale()) return;
  frame.setProject(project);

  let items = [];
  let cursor = null;
  let sessionsByNotebook = new Map();
  const search = h('input', { type: 'search', name: 'q', autocomplete: 'off', testid: 'notebook-search', oninput: () => draw() });
  const count = h('p', { class: 'listing-meta', testid: 'notebook-count', 'aria-live': 'polite' });
  const list = h('div', {}, loading('Loading notebooks…'));
  const more = loadMoreButton('Load more notebooks', 'notebooks-more', () => load(cursor));
  const editor = atLeast(project.role, 'editor');

  fill(frame.body,
    h('section', { class: 'stack', 'aria-labelledby': 'notebooks-heading' },
      h('h2', { id: 'notebooks-heading' }, 'Notebooks'),
      h('div', { class: 'filters', role: 'search' },
        field('Search by title or tag', search, 'Filters the notebooks loaded on this page; load more to search further.')),
      count,
      list,
      h('div', { class: 'pager' }, more)),
    editor ? newNotebookForm(project, sys) : h('p', { class: 'hint', testid: 'viewer-hint' }, 'You are a viewer of this project: you can read notebooks and their history, and run them as apps.'),
    editor ? importForm(project) : null);

  function draw() {
    const q = search.value.trim().toLowerCase();
    const shown = q
      ? items.filter((n) => n.title.toLowerCase().includes(q) || (n.tags ?? []).some((t) => t.toLowerCase().includes(q)))
      : items;
    fill(count, q
      ? `${plural(shown.length, 'notebook')} of ${formatCount(items.length)} loaded match “${search.value.trim()}”.`
      : `${plural(items.length, 'notebook')}${cursor ? ' loaded' : ''}.`);
    fill(list, shown.length ? dataTable({
      testid: 'notebooks-table',
      caption: 'Notebooks of this project',
      head: ['Title', 'Status', numTh('Head revision'), 'Last save', numTh('Active sessions'), 'Tags'],
      rows: shown.map((n) => h('tr', { testid: 'notebook-row', data: { notebookId: n.id, title: n.title } },
        h('th', { scope: 'row', class: 'wrap' },
          h('a', { href: notebookHref(pid, n.id), testid: 'notebook-link', data: { notebookId: n.id } }, n.title),
          isGit(n.source) ? h('div', { class: 'hint row-hint' }, 'Push sync from Git') : null),
        h('td', {}, statusBadge(n.status)),
        h('td', { class: 'num', testid: 'notebook-head' }, n.head_revision != null ? formatCount(n.head_revision) : '—'),
        h('td', {}, time(n.updated_at)),
        h('td', { class: 'num', testid: 'notebook-sessions' }, formatCount(sessionsByNotebook.get(n.id) ?? 0)),
        h('td', { class: 'wrap' }, tagList(n.tags)))),
    }) : h('p', { class: 'empty', testid: 'notebooks-empty' }, items.length
      ? 'No loaded notebook matches the search.'
      : 'No notebooks yet.'));
    more.hidden = !cursor;
  }

  async function load(from) {
    const page = await api('GET', projectApi(pid, '/notebooks'), { query: { limit: PAGE_LIMIT, cursor: from } });
    if (ctx.stale()) return;
    items = items.concat(page.items ?? []);
    cursor = page.next_cursor ?? null;
    draw();
  }

  await load(null);
  // Live sessions, counted per notebook (a courtesy: the list stands without them).
  try {
    const sessions = await allPages(projectApi(pid, '/sessions'));
    if (ctx.stale()) return;
    sessionsByNotebook = countLiveSessions(sessions);
    draw();
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) throw err;
  }
}

export const LIVE_STATUSES = new Set(['starting', 'running', 'terminating']);

export function countLiveSessions(sessions) {
  const counts = new Map();
  for (const s of sessions) {
    if (!LIVE_STATUSES.has(s.status) || s.ended_at) continue;
    counts.set(s.notebook_id, (counts.get(s.notebook_id) ?? 0) + 1);
  }
  return counts;
}

export const parseTags = (text) => [...new Set(text.split(',').map((t) => t.trim()).filter(Boolean))];

function newNotebookForm(project, sys) {
  const title = h('input', { name: 'title', required: true, maxlength: 200, autocomplete: 'off', testid: 'new-notebook-title' });
  const description = h('textarea', { name: 'description', rows: 2, testid: 'new-notebook-description' });
  const tags = h('input', { name: 'tags', autocomplete: 'off', testid: 'new-notebook-tags' });
  const pushSync = feature(sys, 'push_sync');
  const radio = (value, label, testid, checked) => {
    const input = h('input', { type: 'radio', name: 'source', value, checked, testid, id: uid('source') });
    return h('div', { class: 'choice' }, input, h('label', { for: input.id }, label));
  };
  const local = radio('local', 'Saved in the hub (edit it here)', 'new-notebook-source-local', true);
  const git = pushSync ? radio('git', 'Push sync from Git (a workflow pushes each commit)', 'new-notebook-source-git', false) : null;
  const repository = h('input', { name: 'repository', autocomplete: 'off', placeholder: 'owner/repository', testid: 'new-notebook-repository' });
  const branch = h('input', { name: 'branch', autocomplete: 'off', placeholder: 'main', testid: 'new-notebook-branch' });
  const entry = h('input', { name: 'entry', autocomplete: 'off', placeholder: 'notebook.py', testid: 'new-notebook-entry' });
  const gitFields = h('div', { class: 'form-row', hidden: true },
    field('Repository (optional)', repository),
    field('Branch (optional)', branch),
    field('Notebook file (optional)', entry, 'Every push must contain this path.'));
  const form = h('form', { class: 'card', testid: 'new-notebook-form', 'aria-labelledby': 'new-notebook-heading' },
    h('h2', { id: 'new-notebook-heading' }, 'New notebook'),
    field('Title', title),
    field('Description (optional)', description),
    field('Tags (optional)', tags, 'Comma-separated, e.g. finance, draft.'),
    h('fieldset', { class: 'choices' }, h('legend', {}, 'Where its code comes from'), local, git),
    gitFields,
    h('div', { class: 'actions' }, h('button', { type: 'submit', testid: 'new-notebook-submit' }, 'Create notebook')));
  form.addEventListener('change', () => {
    gitFields.hidden = form.elements.source.value !== 'git';
  });
  handleSubmit(form, async () => {
    const body = {
      title: title.value.trim(),
      description: description.value.trim(),
      tags: parseTags(tags.value),
    };
    if (form.elements.source.value === 'git') {
      body.source = {
        type: 'git',
        sync_mode: 'push',
        repository: repository.value.trim() || null,
        branch: branch.value.trim() || null,
        entry_notebook: entry.value.trim() || null,
      };
    }
    const created = await api('POST', projectApi(project.id, '/notebooks'), { json: body });
    if (created.sync_token) setFreshSyncToken({ nid: created.notebook.id, token: created.sync_token });
    toast(`Notebook “${created.notebook.title}” created.`);
    navigate(notebookHref(project.id, created.notebook.id));
  }, 'Creating…');
  return form;
}

function importForm(project) {
  const title = h('input', { name: 'title', required: true, maxlength: 200, autocomplete: 'off', testid: 'import-title' });
  const file = h('input', { type: 'file', name: 'archive', required: true, accept: '.unicas,application/vnd.unicas.archive', testid: 'import-file' });
  const progress = h('progress', { max: 100, value: 0, testid: 'import-progress', id: uid('progress') });
  const progressText = h('span', { 'aria-live': 'polite', testid: 'import-progress-text' });
  const progressRow = h('div', { class: 'progress-row', hidden: true },
    h('label', { for: progress.id }, 'Upload'), progress, progressText);
  const form = h('form', { class: 'card', testid: 'import-form', 'aria-labelledby': 'import-heading' },
    h('h2', { id: 'import-heading' }, 'Import a notebook'),
    h('p', { class: 'hint' }, 'From an archive made by Export (every kept revision comes along).'),
    h('div', { class: 'form-row' }, field('Title of the new notebook', title), field('Archive file', file)),
    progressRow,
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'secondary', testid: 'import-submit' }, 'Import')));
  handleSubmit(form, async () => {
    const chosen = file.files?.[0];
    if (!chosen) throw new Error('Choose an archive file first.');
    progressRow.hidden = false;
    progress.value = 0;
    progressText.textContent = 'Uploading… 0%';
    const url = `/api/v1${projectApi(project.id, `/notebooks/import?title=${enc(title.value.trim())}`)}`;
    let created;
    try {
      created = await uploadWithProgress(url, chosen, 'application/vnd.unicas.archive', (loaded, total) => {
        const pct = total ? Math.floor((loaded / total) * 100) : 0;
        progress.value = pct;
        progressText.textContent = pct >= 100 ? 'Uploaded; the hub is importing…' : `Uploading… ${pct}%`;
      });
    } catch (err) {
      progressText.textContent = 'The import failed.';
      throw err;
    }
    toast(`Notebook “${created.notebook.title}” imported.`);
    navigate(notebookHref(project.id, created.notebook.id));
  }, 'Importing…');
  return form;
}
