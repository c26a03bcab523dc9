// A project's Trash page: its deleted notebooks, restored or purged by a manager.

import { dataTable, fill, h, hiddenTh } from './common.js';
import { enc } from './nav.js';
import { busy, clearAlert, confirmDialog, showError, toast } from './dom.js';
import { atLeast, time } from './format.js';
import { api, person, projectApi, resolveUsers } from './api.js';
import { projectFrame } from './projects.js';

export async function trashView(ctx) {
  const { pid } = ctx;
  const frame = projectFrame('trash', 'Trash');
  const [project, entries] = await Promise.all([
    api('GET', projectApi(pid), { main: true }),
    api('GET', projectApi(pid, '/trash')),
  ]);
  if (ctx.stale()) return;
  frame.setProject(project);
  let items = entries ?? [];
  await resolveUsers(items.map((e) => e.deleted_by));
  if (ctx.stale()) return;
  const manager = atLeast(project.role, 'manager');
  const list = h('div');
  fill(frame.body, h('section', { class: 'stack', 'aria-labelledby': 'trash-heading' },
    h('h2', { id: 'trash-heading', tabindex: -1 }, 'Trash'),
    h('p', { class: 'hint' }, manager
      ? 'Deleted notebooks keep their whole history here. Restore brings one back under its title; purge deletes it for good.'
      : 'Deleted notebooks keep their whole history here. A manager of the project restores or purges them.'),
    list));

  const draw = () => {
    fill(list, items.length ? dataTable({
      testid: 'trash-table',
      caption: 'Notebooks in the trash',
      head: ['Title', 'Deleted', 'By', hiddenTh('Actions')],
      rows: items.map((e) => h('tr', { testid: 'trash-row', data: { notebookId: e.notebook_id, title: e.title } },
        h('th', { scope: 'row', class: 'wrap' }, e.title),
        h('td', {}, time(e.deleted_at)),
        h('td', {}, person(e.deleted_by)),
        h('td', {}, manager ? h('div', { class: 'row-actions' },
          h('button', {
            type: 'button',
            class: 'secondary small',
            testid: 'trash-restore',
            'aria-label': `Restore ${e.title}`,
            onclick: (ev) => restore(ev.currentTarget, e),
          }, 'Restore'),
          h('button', {
            type: 'button',
            class: 'danger small',
            testid: 'trash-purge',
            'aria-label': `Purge ${e.title}`,
            onclick: (ev) => purge(ev.currentTarget, e),
          }, 'Purge…')) : null))),
    }) : h('p', { class: 'empty', testid: 'trash-empty' }, 'The trash is empty.'));
  };

  const restore = async (button, e) => {
    clearAlert();
    try {
      const nb = await busy(button, 'Restoring…', () => api('POST', projectApi(pid, `/trash/${enc(e.token)}/restore`)));
      items = items.filter((x) => x.token !== e.token);
      draw();
      document.getElementById('trash-heading')?.focus();
      toast(`“${nb?.title ?? e.title}” restored with every revision.`);
    } catch (err) {
      showError(err);
    }
  };

  const purge = async (button, e) => {
    const ok = await confirmDialog({
      title: `Purge ${e.title}?`,
      message: 'Every revision of this notebook is deleted for good. This cannot be undone.',
      confirmLabel: 'Purge for good',
      danger: true,
    });
    if (!ok) return;
    clearAlert();
    try {
      await busy(button, 'Purging…', () => api('DELETE', projectApi(pid, `/trash/${enc(e.token)}`)));
      items = items.filter((x) => x.token !== e.token);
      draw();
      document.getElementById('trash-heading')?.focus();
      toast(`“${e.title}” purged.`);
    } catch (err) {
      showError(err);
    }
  };
  draw();
}
