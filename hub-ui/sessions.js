// Sessions: the editor page (start or rejoin an edit session, marimo in a frame, heartbeats,
// take over, close) and the app page (a visit per tab, its heartbeat and departure).

import { ApiError, fill, formatCount, h } from './common.js';
import { session } from './state.js';
import { enc, navigate, notebookHref } from './nav.js';
import { busy, clearAlert, showError, sleep, toast } from './dom.js';
import { atLeast, time } from './format.js';
import { api, apiUrl, feature, notebookApi, person, resolveUsers } from './api.js';
import { LIVE_STATUSES } from './projects.js';
import { loadNotebook, notebookFrame } from './notebook.js';

// Sessions: how often the page polls a starting session and keeps a running one alive.
const POLL_MS = 1000;
const SESSION_HEARTBEAT_MS = 20_000;
const VISIT_HEARTBEAT_MS = 30_000;
const VISIT_KEY = 'unicas-hub.app-visit-id';

/**
 * A session's address (`open_url`, else `sandbox_url`). When sessions have an origin of their
 * own, as given on that origin. Otherwise on this page's origin: the hub answers it absolute
 * when it knows its public URL, which may name the hub otherwise than this browser does; the
 * page may only frame its own origin, and the session's cookie is set there.
 */
function sessionAddress(url) {
  if (!url) return null;
  try {
    const u = new URL(url, window.location.origin);
    if (!u.pathname.startsWith('/s/')) return null;
    if (session.sessionOrigin) {
      return u.origin === new URL(session.sessionOrigin).origin ? u.href : null;
    }
    return u.pathname + u.search;
  } catch {
    return null;
  }
}

function endedText(s) {
  const why = s.error?.message ? `: ${s.error.message}` : '.';
  return `The session is ${s.status ?? 'gone'}${why}`;
}

export async function editView(ctx) {
  const { pid, nid } = ctx;
  const frame = notebookFrame('edit-title');
  const [project, nb, sys] = await loadNotebook(ctx);
  if (ctx.stale()) return;
  frame.set(project, nb, { title: `Editing ${nb.title}`, crumb: 'Editor' });
  const status = h('p', { class: 'session-status', testid: 'session-status', 'aria-live': 'polite', data: { state: 'starting' } }, 'Starting an edit session…');
  const claimArea = h('div');
  const banner = h('div');
  const frameArea = h('div', { class: 'frame-area' });
  const newTab = h('span');
  const close = h('button', { type: 'button', class: 'secondary', testid: 'close-session', hidden: true }, 'Close session');
  fill(frame.body,
    h('div', { class: 'session-bar' }, status, h('div', { class: 'actions' }, newTab, close)),
    h('p', { class: 'hint' }, 'Your changes are saved as new revisions while you edit and when you close the session. Leaving this page keeps the session until it idles out.'),
    claimArea, banner, frameArea);
  if (!atLeast(project.role, 'editor')) {
    status.textContent = 'Editing needs the editor role in this project: you can read the notebook and run it as an app.';
    close.hidden = true;
    return;
  }
  if (!feature(sys, 'sessions')) {
    status.textContent = 'This hub runs no notebook sessions.';
    close.hidden = true;
    return;
  }

  const sessionsApi = notebookApi(pid, nid, '/sessions');
  const sessionApi = (sid) => notebookApi(pid, nid, `/sessions/${enc(sid)}`);
  let current = null;
  let left = false;
  let timer = 0;
  let lastBeat = 0;
  const onVisible = () => {
    if (document.visibilityState === 'visible' && Date.now() - lastBeat > SESSION_HEARTBEAT_MS / 2) beat();
  };
  ctx.onLeave(() => {
    left = true;
    clearInterval(timer);
    document.removeEventListener('visibilitychange', onVisible);
  });

  const setStatus = (text, state) => {
    status.textContent = text;
    if (state) status.dataset.state = state;
  };

  const drawBanner = (s) => {
    fill(banner, s?.branched ? h('div', { class: 'banner banner-warn', testid: 'branched-banner', role: 'status' },
      h('strong', {}, 'Your edits were kept as a branch. '),
      'A save conflicted with a newer revision of this notebook, so this session now saves to a separate notebook: ',
      s.saves_to && s.saves_to !== nid
        ? h('a', { href: notebookHref(pid, s.saves_to), testid: 'branch-link' }, 'open the branch')
        : 'see the project\'s notebooks',
      '. Nothing was overwritten.') : null);
  };

  async function start() {
    fill(claimArea);
    setStatus('Starting an edit session…', 'starting');
    let s;
    try {
      s = await api('POST', sessionsApi, { json: { mode: 'edit' } });
    } catch (err) {
      if (err instanceof ApiError && err.code === 'editor_claimed') {
        await showClaim(err);
        return;
      }
      setStatus('The session could not be started.', 'failed');
      throw err;
    }
    await follow(s);
  }

  async function follow(first) {
    let s = first;
    current = s;
    close.hidden = false;
    close.disabled = false;
    drawBanner(s);
    const started = Date.now();
    while (!left && s.status === 'starting') {
      setStatus(`Starting marimo… ${Math.round((Date.now() - started) / 1000)} s`, 'starting');
      await sleep(POLL_MS);
      if (left) return;
      s = await api('GET', sessionApi(s.session_id));
      current = s;
      drawBanner(s);
    }
    if (left) return;
    if (s.status === 'running') showEditor(s);
    else ended(s);
  }

  function showEditor(s) {
    const url = sessionAddress(s.open_url || s.sandbox_url);
    if (!url) {
      setStatus('The session runs, but the hub gave no address to open it.', 'running');
      return;
    }
    setStatus(`Running${s.runtime ? ` (marimo ${s.runtime.marimo_version}, Python ${s.runtime.python_version})` : ''}.`, 'running');
    fill(frameArea, h('iframe', {
      src: url,
      title: `marimo editor for ${nb.title}`,
      testid: 'editor-frame',
      class: 'session-frame',
      allow: 'clipboard-read; clipboard-write',
    }));
    const tabUrl = sessionAddress(s.sandbox_url);
    fill(newTab, tabUrl
      ? h('a', { href: tabUrl, target: '_blank', rel: 'noopener', testid: 'editor-new-tab' }, 'Open in a new tab')
      : null);
    clearInterval(timer);
    lastBeat = Date.now();
    timer = setInterval(beat, SESSION_HEARTBEAT_MS);
    document.addEventListener('visibilitychange', onVisible);
  }

  async function beat() {
    if (left || !current || document.visibilityState !== 'visible') return;
    lastBeat = Date.now();
    try {
      const s = await api('POST', `${sessionApi(current.session_id)}/heartbeat`);
      if (left) return;
      current = s;
      drawBanner(s);
      if (!LIVE_STATUSES.has(s.status)) ended(s);
    } catch (err) {
      if (left) return;
      if (err instanceof ApiError && err.status === 404) {
        ended({ status: 'gone' });
        return;
      }
      showError(err);
    }
  }

  function ended(s) {
    clearInterval(timer);
    close.disabled = true;
    setStatus(endedText(s), s.status ?? 'gone');
    const again = h('button', { type: 'button', testid: 'session-restart' }, 'Start a new session');
    again.addEventListener('click', () => {
      clearAlert();
      start().catch((err) => { if (!left) showError(err); });
    });
    fill(frameArea, h('div', { class: 'actions' }, again, h('a', { href: notebookHref(pid, nid) }, 'Back to the notebook')));
    fill(newTab);
    if (s.status === 'failed') showError(new ApiError(0, s.error?.code ?? 'session_failed', endedText(s)));
  }

  async function showClaim(err) {
    const holder = err.details?.holder;
    const since = err.details?.claimed_at;
    if (holder) await resolveUsers([holder]);
    if (left) return;
    setStatus('Someone else has this notebook open in the editor.', 'claimed');
    const take = h('button', { type: 'button', class: 'danger', testid: 'takeover-button' }, 'Take over the editor');
    take.addEventListener('click', () => takeOver(take));
    fill(claimArea, h('section', { class: 'card claim', testid: 'editor-claimed', 'aria-labelledby': 'claim-heading' },
      h('h2', { id: 'claim-heading' }, 'The editor is in use'),
      h('p', {}, holder ? person(holder, 'editor-holder') : 'Another user', ' is editing this notebook',
        since ? [' since ', time(since)] : null, '. Only one person edits a notebook at a time.'),
      h('p', { class: 'hint' }, 'Taking over saves their changes as a new revision and closes their editor; then yours opens.'),
      h('div', { class: 'actions' }, take, h('a', { href: notebookHref(pid, nid) }, 'Back to the notebook'))));
  }

  async function takeOver(button) {
    clearAlert();
    try {
      const s = await busy(button, 'Taking over…', async () => {
        await api('POST', notebookApi(pid, nid, '/editor-session/takeover'));
        // The holder's changes are saved and its sandbox stopped; the editor is then ours.
        const deadline = Date.now() + 60_000;
        for (;;) {
          try {
            return await api('POST', sessionsApi, { json: { mode: 'edit' } });
          } catch (e) {
            if (!(e instanceof ApiError && e.code === 'editor_claimed') || Date.now() > deadline || left) throw e;
            await sleep(2000);
          }
        }
      });
      if (left) return;
      fill(claimArea);
      await follow(s);
    } catch (err) {
      if (!left) showError(err);
    }
  }

  async function closeSession() {
    if (!current) return;
    clearAlert();
    try {
      await busy(close, 'Closing… saving your changes', () => api('DELETE', sessionApi(current.session_id)));
      toast('Session closed: your changes are saved.');
      navigate(notebookHref(pid, nid));
    } catch (err) {
      showError(err);
    }
  }
  close.addEventListener('click', closeSession);

  await start();
}

/** This tab's app visit id: made once per tab, kept in sessionStorage. */
let tabVisitId = null;
function visitId() {
  try {
    const kept = window.sessionStorage.getItem(VISIT_KEY);
    if (kept && /^[A-Za-z0-9_-]{1,128}$/.test(kept)) return kept;
  } catch {
    // Storage may be off: the id then lives as long as this page.
  }
  if (!tabVisitId) {
    const alphabet = 'abcdefghijklmnopqrstuvwxyz234567';
    const random = crypto.getRandomValues(new Uint8Array(20));
    tabVisitId = `tab-${[...random].map((b) => alphabet[b % 32]).join('')}`;
  }
  try {
    window.sessionStorage.setItem(VISIT_KEY, tabVisitId);
  } catch {
    // See above.
  }
  return tabVisitId;
}

export async function appView(ctx) {
  const { pid, nid } = ctx;
  const frame = notebookFrame('app-title');
  const [project, nb, sys] = await loadNotebook(ctx);
  if (ctx.stale()) return;
  frame.set(project, nb, { title: `${nb.title} as an app`, crumb: 'App' });
  const status = h('p', { class: 'session-status', testid: 'app-status', 'aria-live': 'polite', data: { state: 'starting' } }, 'Opening the app…');
  const occupancy = h('p', { class: 'hint', testid: 'app-occupancy' });
  const frameArea = h('div', { class: 'frame-area' });
  fill(frame.body, h('div', { class: 'session-bar' }, status, h('a', { href: notebookHref(pid, nid) }, 'Back to the notebook')), occupancy, frameArea);
  if (!feature(sys, 'sessions') || !feature(sys, 'app_pools')) {
    status.textContent = 'This hub does not run notebooks as apps.';
    return;
  }

  const visit = visitId();
  const sessionsApi = notebookApi(pid, nid, '/sessions');
  let assignment = null;
  let left = false;
  let timer = 0;
  let lastBeat = 0;
  const setStatus = (text, state) => {
    status.textContent = text;
    if (state) status.dataset.state = state;
  };
  const departureUrl = () => apiUrl(assignment?.departure || notebookApi(pid, nid, `/app-pool/visits/${enc(visit)}/departure`));
  // The page is going away: keep the slot for the reconnect grace only. keepalive lets the
  // request outlive the page.
  const depart = () => {
    if (!assignment) return;
    fetch(departureUrl(), {
      method: 'POST',
      keepalive: true,
      credentials: 'same-origin',
      headers: session.csrf ? { 'X-CSRF-Token': session.csrf } : {},
    }).catch(() => {});
  };
  const onPageHide = () => depart();
  const onPageShow = (event) => {
    if (event.persisted) beat();
  };
  const onVisible = () => {
    if (document.visibilityState === 'visible' && Date.now() - lastBeat > VISIT_HEARTBEAT_MS / 2) beat();
  };
  window.addEventListener('pagehide', onPageHide);
  window.addEventListener('pageshow', onPageShow);
  document.addEventListener('visibilitychange', onVisible);
  ctx.onLeave(() => {
    left = true;
    clearInterval(timer);
    window.removeEventListener('pagehide', onPageHide);
    window.removeEventListener('pageshow', onPageShow);
    document.removeEventListener('visibilitychange', onVisible);
    depart();
  });

  async function admit() {
    clearInterval(timer);
    setStatus('Asking for a seat in the app…', 'starting');
    let s;
    for (let attempt = 0; ; attempt += 1) {
      try {
        s = await api('POST', sessionsApi, { json: { mode: 'app', app_visit_id: visit } });
        break;
      } catch (err) {
        if (err instanceof ApiError && err.code === 'app_pool_full' && !left && attempt < 60) {
          const wait = err.retryAfter ?? 5;
          setStatus(`Every sandbox of this app is full. Trying again in ${wait} s…`, 'full');
          await sleep(wait * 1000);
          if (left) return;
          continue;
        }
        setStatus('The app could not be opened.', 'failed');
        throw err;
      }
    }
    assignment = s.app_assignment ?? null;
    if (s.users != null) {
      occupancy.textContent = `Visitors on this sandbox: ${formatCount(s.users)}${s.max_users_per_session != null ? ` of ${formatCount(s.max_users_per_session)}` : ''}.`;
    }
    const started = Date.now();
    while (!left && s.status === 'starting') {
      setStatus(`Starting the app… ${Math.round((Date.now() - started) / 1000)} s`, 'starting');
      await sleep(POLL_MS);
      if (left) return;
      s = await api('GET', notebookApi(pid, nid, `/sessions/${enc(s.session_id)}`));
    }
    if (left) return;
    if (s.status !== 'running') {
      setStatus(endedText(s), s.status);
      if (s.status === 'failed') showError(new ApiError(0, s.error?.code ?? 'session_failed', endedText(s)));
      return;
    }
    const url = sessionAddress(s.open_url || s.sandbox_url);
    if (!url) {
      setStatus('The app runs, but the hub gave no address to open it.', 'running');
      return;
    }
    setStatus(`Running${assignment?.revision != null ? ` revision ${assignment.revision}` : ''}.`, 'running');
    fill(frameArea, h('iframe', { src: url, title: `${nb.title}, running as an app`, testid: 'app-frame', class: 'session-frame' }));
    lastBeat = Date.now();
    timer = setInterval(beat, VISIT_HEARTBEAT_MS);
  }

  async function beat() {
    if (left || !assignment || document.visibilityState !== 'visible') return;
    lastBeat = Date.now();
    try {
      const a = await api('POST', assignment.heartbeat || notebookApi(pid, nid, `/app-pool/visits/${enc(visit)}/heartbeat`));
      if (a && typeof a === 'object') assignment = { ...assignment, ...a };
    } catch (err) {
      if (left) return;
      if (err instanceof ApiError && err.status === 404) {
        // The slot was released (the lease ran out): ask for one again.
        admit().catch((e) => { if (!left) showError(e); });
        return;
      }
      showError(err);
    }
  }

  await admit();
}
