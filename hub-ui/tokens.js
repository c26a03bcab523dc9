// The Access tokens page: your personal access tokens, created (shown once) and revoked.

import { dataTable, field, fill, h, hiddenTh, loading, plural } from './common.js';
import { enc } from './nav.js';
import {
  busy, clearAlert, confirmDialog, copyBlock, handleSubmit, mount, setTitle, showError, toast
} from './dom.js';
import { roleName, time } from './format.js';
import { api } from './api.js';

function scopeText(scope) {
  if (!scope) return 'Everything you can do';
  const where = scope.projects === '*' ? 'every project' : plural(Array.isArray(scope.projects) ? scope.projects.length : 0, 'project');
  return `${roleName(scope.role)} on ${where}`;
}

export async function tokensView(ctx) {
  setTitle('Access tokens');
  let tokens = [];
  const list = h('div', {}, loading('Loading tokens…'));
  const fresh = h('div', { 'aria-live': 'polite' });
  const name = h('input', { name: 'name', required: true, maxlength: 200, autocomplete: 'off', testid: 'token-name' });
  const days = h('input', { name: 'expires_in_days', type: 'number', min: 1, max: 36500, step: 1, inputmode: 'numeric', testid: 'token-expiry' });
  const form = h('form', { class: 'card', testid: 'token-form', 'aria-labelledby': 'new-token-heading' },
    h('h2', { id: 'new-token-heading' }, 'New token'),
    h('div', { class: 'form-row' },
      field('Name', name, 'What it is for, e.g. “laptop CLI” or “CI export”.'),
      field('Expires after (days, optional)', days, 'Empty: it never expires.')),
    h('div', { class: 'actions' }, h('button', { type: 'submit', testid: 'token-submit' }, 'Create token')));
  mount(
    h('h1', { tabindex: -1 }, 'Access tokens'),
    h('p', { class: 'hint' },
      'Personal access tokens let scripts and tools use the hub\'s API as you: send one as ',
      h('code', {}, 'Authorization: Bearer uhub_pat_…'), '. Revoke a token you no longer use.'),
    fresh,
    form,
    h('section', { class: 'stack', 'aria-labelledby': 'tokens-heading' },
      h('h2', { id: 'tokens-heading', tabindex: -1 }, 'Your tokens'),
      list));

  const draw = () => {
    fill(list, tokens.length ? dataTable({
      testid: 'tokens-table',
      caption: 'Your personal access tokens',
      head: ['Name', 'Created', 'Expires', 'Last used', 'Scope', hiddenTh('Actions')],
      rows: tokens.map((t) => h('tr', { testid: 'token-row', data: { tokenId: t.id, name: t.name } },
        h('th', { scope: 'row', class: 'wrap' }, t.name),
        h('td', {}, time(t.created_at)),
        h('td', {}, t.expires_at ? time(t.expires_at) : 'never'),
        h('td', {}, t.last_used_at ? time(t.last_used_at) : 'never'),
        h('td', { class: 'wrap' }, scopeText(t.scope)),
        h('td', {}, h('button', {
          type: 'button',
          class: 'danger small',
          testid: 'token-revoke',
          'aria-label': `Revoke token ${t.name}`,
          onclick: (e) => revoke(e.currentTarget, t),
        }, 'Revoke…')))),
    }) : h('p', { class: 'empty', testid: 'tokens-empty' }, 'You have no tokens.'));
  };

  const revoke = async (button, t) => {
    const ok = await confirmDialog({
      title: `Revoke ${t.name}?`,
      message: 'Every script or tool that uses this token is refused from now on. A revoked token cannot be restored.',
      confirmLabel: 'Revoke token',
      danger: true,
    });
    if (!ok) return;
    clearAlert();
    try {
      await busy(button, 'Revoking…', () => api('DELETE', `/auth/tokens/${enc(t.id)}`));
      tokens = tokens.filter((x) => x.id !== t.id);
      draw();
      document.getElementById('tokens-heading')?.focus();
      toast(`Token ${t.name} revoked.`);
    } catch (err) {
      showError(err);
    }
  };

  handleSubmit(form, async () => {
    const body = { name: name.value.trim() };
    if (days.value) body.expires_in_days = Number(days.value);
    const created = await api('POST', '/auth/tokens', { json: body });
    const { token, ...info } = created;
    tokens = [...tokens.filter((x) => x.id !== info.id), info];
    draw();
    form.reset();
    const dismiss = h('button', { type: 'button', class: 'secondary small', testid: 'new-token-dismiss', onclick: () => fill(fresh) }, 'Done');
    fill(fresh, h('section', { class: 'card new-secret', testid: 'new-token-card', 'aria-labelledby': 'fresh-token-heading' },
      h('h2', { id: 'fresh-token-heading', tabindex: -1 }, `Token “${info.name}” created`),
      h('p', { class: 'warn' }, 'Copy it now: it is shown only this once.'),
      copyBlock(token, { testid: 'new-token', label: 'Token', copyTestid: 'copy-token', done: 'Token copied.' }),
      h('div', { class: 'actions' }, dismiss)));
    document.getElementById('fresh-token-heading')?.focus();
  }, 'Creating…');

  tokens = (await api('GET', '/auth/tokens')) ?? [];
  if (ctx.stale()) return;
  draw();
}
