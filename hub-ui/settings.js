// A project's Settings page: its details and default access, members and their roles,
// invitations by email, and moving the project to the trash.

import { dataTable, field, fill, h, hiddenTh, loading } from './common.js';
import { enc, navigate } from './nav.js';
import { busy, clearAlert, confirmDialog, handleSubmit, showError, toast } from './dom.js';
import { atLeast, badge, ROLE_RANK, roleName, time } from './format.js';
import { api, feature, person, personName, projectApi, resolveUsers, system } from './api.js';
import { projectFrame } from './projects.js';

const MEMBER_ROLES = ['viewer', 'editor', 'manager'];
const DEFAULT_ROLES = [
  ['inherit', 'The deployment\'s default'],
  ['none', 'No access'],
  ['viewer', 'Viewer'],
  ['editor', 'Editor'],
];

export async function settingsView(ctx) {
  const { pid } = ctx;
  const frame = projectFrame('settings', 'Settings');
  let [project, sys] = await Promise.all([api('GET', projectApi(pid), { main: true }), system()]);
  if (ctx.stale()) return;
  frame.setProject(project);
  const manager = atLeast(project.role, 'manager');
  await resolveUsers([project.owner, ...project.members.map((m) => m.user_id)]);
  if (ctx.stale()) return;

  const membersArea = h('div');
  const invitationsArea = h('div');
  const setProject = (p) => {
    project = p;
    frame.setProject(p);
    drawMembers();
  };

  const drawMembers = () => {
    const rows = [...project.members].sort((a, b) => (ROLE_RANK[b.role] - ROLE_RANK[a.role]) || personName(a.user_id).localeCompare(personName(b.user_id)));
    fill(membersArea, rows.length ? dataTable({
      testid: 'members-table',
      caption: 'Members of this project',
      head: ['Name', 'User id', 'Role', hiddenTh('Actions')],
      rows: rows.map((m) => {
        const owner = m.role === 'admin' || m.user_id === project.owner;
        let roleCell;
        if (manager && !owner) {
          const select = h('select', { testid: 'member-role', 'aria-label': `Role of ${personName(m.user_id)}`, value: m.role },
            MEMBER_ROLES.map((r) => h('option', { value: r }, roleName(r))));
          const save = h('button', { type: 'button', class: 'secondary small', testid: 'member-role-save' }, 'Change role');
          save.addEventListener('click', () => changeRole(save, m, select.value));
          roleCell = h('div', { class: 'inline-form' }, select, save);
        } else {
          roleCell = badge(owner ? `${roleName(m.role)} (owner)` : roleName(m.role), null, 'member-role-text');
        }
        return h('tr', { testid: 'member-row', data: { userId: m.user_id, role: m.role } },
          h('th', { scope: 'row' }, person(m.user_id)),
          h('td', {}, h('code', {}, m.user_id)),
          h('td', {}, roleCell),
          h('td', {}, manager && !owner ? h('button', {
            type: 'button',
            class: 'danger small',
            testid: 'member-remove',
            'aria-label': `Remove ${personName(m.user_id)}`,
            onclick: (e) => removeMember(e.currentTarget, m),
          }, 'Remove…') : null));
      }),
    }) : h('p', { class: 'empty' }, 'No members.'));
  };

  const changeRole = async (button, m, role) => {
    clearAlert();
    try {
      const p = await busy(button, 'Saving…', () => api('PUT', projectApi(pid, '/members'), { json: { user_id: m.user_id, role } }));
      setProject(p);
      toast(`${personName(m.user_id)} is now ${roleName(role).toLowerCase()}.`);
    } catch (err) {
      showError(err);
    }
  };

  const removeMember = async (button, m) => {
    const who = personName(m.user_id);
    const ok = await confirmDialog({
      title: `Remove ${who}?`,
      message: `${who} will no longer reach ${project.name} (unless the project's default access lets every signed-in user in).`,
      confirmLabel: 'Remove member',
      danger: true,
    });
    if (!ok) return;
    clearAlert();
    try {
      const members = await busy(button, 'Removing…', () => api('DELETE', projectApi(pid, `/members/${enc(m.user_id)}`)));
      setProject({ ...project, members: Array.isArray(members) ? members : project.members.filter((x) => x.user_id !== m.user_id) });
      toast(`${who} removed.`);
    } catch (err) {
      showError(err);
    }
  };

  const sections = [
    h('section', { class: 'stack', 'aria-labelledby': 'members-heading' },
      h('h2', { id: 'members-heading' }, 'Members'),
      h('p', { class: 'hint' }, 'Viewers read notebooks and run them as apps; editors also change them; managers also manage members, the trash and settings.'),
      membersArea),
  ];
  if (!manager) {
    fill(frame.body, h('p', { class: 'hint', testid: 'settings-readonly' }, 'Only managers of this project change its settings and members.'), ...sections);
    drawMembers();
    return;
  }

  // Details: name, description, default access.
  const name = h('input', { name: 'name', required: true, maxlength: 200, value: project.name, testid: 'settings-name' });
  const description = h('textarea', { name: 'description', rows: 3, value: project.description ?? '', testid: 'settings-description' });
  const defaultRole = h('select', { name: 'default_role', testid: 'settings-default-role', value: project.default_role ?? 'inherit' },
    DEFAULT_ROLES.map(([v, label]) => h('option', { value: v }, label)));
  const detailsForm = h('form', { class: 'card', testid: 'settings-form', 'aria-labelledby': 'details-heading' },
    h('h2', { id: 'details-heading' }, 'Details'),
    field('Name', name),
    field('Description', description),
    field('Default access for signed-in users who are not members', defaultRole),
    h('div', { class: 'actions' }, h('button', { type: 'submit', testid: 'settings-submit' }, 'Save details')));
  handleSubmit(detailsForm, async () => {
    const p = await api('PATCH', projectApi(pid), {
      json: { name: name.value.trim(), description: description.value.trim(), default_role: defaultRole.value },
    });
    setProject(p);
    toast('Details saved.');
  }, 'Saving…');

  // Add a member by user id.
  const userId = h('input', { name: 'user_id', required: true, autocomplete: 'off', spellcheck: 'false', testid: 'add-member-id' });
  const role = h('select', { name: 'role', testid: 'add-member-role', value: 'viewer' }, MEMBER_ROLES.map((r) => h('option', { value: r }, roleName(r))));
  const addForm = h('form', { class: 'card', testid: 'add-member-form', 'aria-labelledby': 'add-member-heading' },
    h('h2', { id: 'add-member-heading' }, 'Add a member'),
    h('div', { class: 'form-row' },
      field('User id', userId, 'The id of an existing user, as the operator created it (unicas-hub user create ID).'),
      field('Role', role)),
    h('div', { class: 'actions' }, h('button', { type: 'submit', testid: 'add-member-submit' }, 'Add member')));
  handleSubmit(addForm, async () => {
    const id = userId.value.trim();
    const p = await api('PUT', projectApi(pid, '/members'), { json: { user_id: id, role: role.value } });
    await resolveUsers([id]);
    setProject(p);
    addForm.reset();
    toast(`${personName(id)} added as ${role.value}.`);
  }, 'Adding…');

  sections.push(addForm);

  // Invitations by email.
  if (feature(sys, 'invitations')) {
    sections.push(invitationsSection(pid, invitationsArea, async (p) => {
      const ids = p.members.map((m) => m.user_id);
      await resolveUsers(ids);
      setProject(p);
    }));
  }
  sections.push(deleteProjectSection(project));
  fill(frame.body, detailsForm, ...sections);
  drawMembers();
}

function invitationsSection(pid, area, onMember) {
  let invitations = [];
  const email = h('input', { type: 'email', name: 'email', required: true, autocomplete: 'off', testid: 'invite-email' });
  const role = h('select', { name: 'role', testid: 'invite-role', value: 'viewer' }, MEMBER_ROLES.map((r) => h('option', { value: r }, roleName(r))));
  const form = h('form', { class: 'card', testid: 'invite-form', 'aria-labelledby': 'invite-heading' },
    h('h2', { id: 'invite-heading' }, 'Invitations'),
    h('p', { class: 'hint' }, 'Invite someone by email: a user with that email becomes a member now; otherwise the invitation waits for their first sign-in.'),
    area,
    h('div', { class: 'form-row' }, field('Email', email), field('Role', role)),
    h('div', { class: 'actions' }, h('button', { type: 'submit', testid: 'invite-submit' }, 'Invite')));
  const draw = () => {
    fill(area, invitations.length ? dataTable({
      testid: 'invitations-table',
      caption: 'Open invitations',
      head: ['Email', 'Role', 'Invited', 'By', hiddenTh('Actions')],
      rows: invitations.map((inv) => h('tr', { testid: 'invitation-row', data: { email: inv.email } },
        h('th', { scope: 'row', class: 'wrap' }, inv.email),
        h('td', {}, roleName(inv.role)),
        h('td', {}, time(inv.invited_at)),
        h('td', {}, person(inv.invited_by)),
        h('td', {}, h('button', {
          type: 'button',
          class: 'danger small',
          testid: 'invitation-withdraw',
          'aria-label': `Withdraw the invitation of ${inv.email}`,
          onclick: (e) => withdraw(e.currentTarget, inv),
        }, 'Withdraw')))),
    }) : h('p', { class: 'empty', testid: 'invitations-empty' }, 'No open invitations.'));
  };
  const withdraw = async (button, inv) => {
    clearAlert();
    try {
      await busy(button, 'Withdrawing…', () => api('DELETE', projectApi(pid, `/invitations/${enc(inv.email)}`)));
      invitations = invitations.filter((x) => x.email !== inv.email);
      draw();
      toast(`Invitation of ${inv.email} withdrawn.`);
    } catch (err) {
      showError(err);
    }
  };
  handleSubmit(form, async () => {
    const answer = await api('POST', projectApi(pid, '/invitations'), { json: { email: email.value.trim(), role: role.value } });
    if (answer.status === 'member' && answer.project) {
      await onMember(answer.project);
      toast(`${email.value.trim()} already had an account and is now a member.`);
    } else if (answer.invitation) {
      invitations = [...invitations.filter((x) => x.email !== answer.invitation.email), answer.invitation];
      draw();
      toast(`${answer.invitation.email} is invited.`);
    }
    form.reset();
  }, 'Inviting…');
  fill(area, loading('Loading invitations…'));
  api('GET', projectApi(pid, '/invitations'))
    .then(async (list) => {
      invitations = list ?? [];
      await resolveUsers(invitations.map((i) => i.invited_by));
      draw();
    })
    .catch((err) => {
      fill(area, h('p', { class: 'empty' }, 'The invitations could not be loaded.'));
      showError(err);
    });
  return form;
}

function deleteProjectSection(project) {
  const button = h('button', { type: 'button', class: 'danger', testid: 'delete-project' }, 'Move project to the trash…');
  button.addEventListener('click', async () => {
    const ok = await confirmDialog({
      title: `Move ${project.name} to the trash?`,
      message: 'The project, with every notebook and revision it holds, goes to the trash. It can be restored from the Projects page until it is purged.',
      confirmLabel: 'Move to trash',
      danger: true,
    });
    if (!ok) return;
    clearAlert();
    try {
      await busy(button, 'Moving to the trash…', () => api('DELETE', projectApi(project.id)));
      toast(`Project “${project.name}” moved to the trash.`);
      navigate('/');
    } catch (err) {
      showError(err);
    }
  });
  return h('section', { class: 'card danger-zone', 'aria-labelledby': 'danger-heading' },
    h('h2', { id: 'danger-heading' }, 'Delete the project'),
    h('p', { class: 'hint' }, 'Refused while sessions run on its notebooks.'),
    h('div', { class: 'actions' }, button));
}
