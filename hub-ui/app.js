// UniCAS hub UI: a single-page app over the hub's JSON API (/api/v1) and its browser session
// (/auth/session, /auth/logout).
//
// Plain ES modules with no build step: the hub serves each file of hub-ui/ as it is, at
// /ui/<name>.js, under a strict CSP (scripts and styles from 'self' only: no inline script, no
// style attributes, nothing from another origin). Every page has a real address (History API):
// links stay links that can be opened in a new tab, shared and reloaded. Data from the API is
// hostile (titles, messages, file contents): it only ever goes into the page as text
// (textContent, never innerHTML).
//
// This module is the entry (index.html loads only it): the table of views, the router, the
// header's account, the sign-in and Not found pages, and start-up. The modules, lowest first
// (each imports only from those before it):
//   common.js    what the admin UI shares (web-common/): element builders, fields, tables,
//                counts and bytes, ApiError and the request helpers, alerts, toast, dialog
//   state.js     the browser session, the fresh sync token handed to a notebook page
//   nav.js       addresses, navigate() and the way to sign-in (the router registers itself)
//   dom.js       this page's alerts, toast, dialog and forms (from common.js), busy buttons
//   format.js    times, roles, badges
//   api.js       the fetch wrapper, pages of lists, user names, features, file bytes, uploads
//   projects.js  the projects page, the project frame, a project's notebooks
//   settings.js, trash.js, storage.js   a project's other pages
//   notebook.js  a notebook's page, the notebook frame, the files table
//   files.js     a revision's files and one file's text; the revision picker
//   diff.js      comparing two revisions (Myers diff, unified or side by side)
//   sessions.js  the editor and app pages
//   tokens.js    personal access tokens

import { ApiError, fill, h } from './common.js';
import { session, setSession } from './state.js';
import { enc, goLogin, isUiPath, navigate, parseRoute, safeNext, setRouter } from './nav.js';
import { bindSkeleton, clearAlert, els, mount, runView, setTitle, showError } from './dom.js';
import { api } from './api.js';
import { projectsView, projectView } from './projects.js';
import { settingsView } from './settings.js';
import { trashView } from './trash.js';
import { storageView } from './storage.js';
import { notebookView } from './notebook.js';
import { fileView } from './files.js';
import { diffView } from './diff.js';
import { appView, editView } from './sessions.js';
import { tokensView } from './tokens.js';

/* ------------------------------------------------------------------------------------------ */
/* Routing                                                                                     */
/* ------------------------------------------------------------------------------------------ */

const PROJECT_TABS = { settings: settingsView, trash: trashView, storage: storageView };
const NOTEBOOK_PAGES = { diff: diffView, edit: editView, app: appView, files: fileView };

function resolveView(segments) {
  const n = segments.length;
  if (n === 0) return projectsView;
  const [first, , second, , third] = segments;
  if (n === 1 && first === 'login') return loginView;
  if (n === 1 && first === 'tokens') return tokensView;
  if (first === 'projects') {
    if (n === 1) return projectsView;
    if (n === 2) return projectView;
    if (n === 3) return PROJECT_TABS[second] ?? notFoundView;
    if (second === 'notebooks') {
      if (n === 4) return notebookView;
      if (n === 5) return NOTEBOOK_PAGES[third] ?? notFoundView;
      if (third === 'files') return fileView;
    }
  }
  return notFoundView;
}

/** Same-origin links to UI addresses navigate in place; everything else is left alone. */
function interceptLinks(event) {
  if (event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  const a = event.target instanceof Element ? event.target.closest('a[href]') : null;
  if (!a || (a.target && a.target !== '_self') || a.hasAttribute('download')) return;
  const url = new URL(a.href, window.location.href);
  if (url.origin !== window.location.origin || !isUiPath(url.pathname)) return;
  // An in-page anchor (#…) of the current address.
  if (url.pathname === window.location.pathname && url.search === window.location.search && url.hash) return;
  event.preventDefault();
  navigate(url.href);
}

let routeSeq = 0;
let leaveHandlers = [];

function leavePage() {
  const handlers = leaveHandlers;
  leaveHandlers = [];
  for (const fn of handlers) {
    try {
      fn();
    } catch {
      // A page's cleanup must not stop the next page.
    }
  }
}

function markNav(segments) {
  const current = segments[0] === 'tokens' ? 'tokens' : segments[0] === 'login' ? null : 'projects';
  for (const a of els.siteNav.querySelectorAll('a[data-nav]')) {
    if (a.dataset.nav === current) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

/**
 * Renders the view of the current address. Views mount their headings synchronously and then
 * load; `ctx.stale()` tells a view that the user has moved on, so late answers are dropped, and
 * `ctx.onLeave(fn)` registers what to stop (timers, listeners) when the page is left.
 */
async function route({ initial = false } = {}) {
  leavePage();
  const seq = ++routeSeq;
  const { segments, params } = parseRoute();
  const view = resolveView(segments);
  const signedIn = Boolean(session.user) || session.authMode === 'none';
  if (view === loginView && signedIn) {
    navigate(safeNext(params.get('next')), { replace: true });
    return;
  }
  if (view !== loginView && !signedIn) {
    goLogin();
    return;
  }
  const ctx = {
    segments,
    params,
    pid: segments[1],
    nid: segments[3],
    stale: () => seq !== routeSeq,
    onLeave: (fn) => leaveHandlers.push(fn),
  };
  markNav(segments);
  await runView(view, ctx, {
    initial,
    // The page's main resource (a project, a notebook) answered 404: the Not found page.
    onFail: (err) => {
      if (!(err instanceof ApiError && err.main && err.status === 404)) return false;
      notFoundView(ctx);
      if (!initial) els.main.querySelector('h1')?.focus();
      return true;
    },
  });
}

/* ------------------------------------------------------------------------------------------ */
/* Session and sign-in                                                                         */
/* ------------------------------------------------------------------------------------------ */

async function loadSession() {
  const data = await api('GET', '/auth/session');
  setSession({
    user: data?.user ?? null,
    csrf: data?.csrf_token ?? null,
    authMode: data?.auth_mode ?? 'token',
    providers: Array.isArray(data?.providers) ? data.providers : [],
    sessionOrigin: typeof data?.session_origin === 'string' ? data.session_origin : null,
  });
  renderAccount();
}

function renderAccount() {
  const { user } = session;
  const signedIn = Boolean(user);
  els.siteNav.hidden = !signedIn && session.authMode !== 'none';
  els.account.hidden = !signedIn;
  els.logout.hidden = session.authMode === 'none';
  if (!user) {
    fill(els.accountName);
    return;
  }
  fill(els.accountName, user.name || user.email || user.id,
    user.super_admin ? [' ', h('span', { class: 'badge' }, 'Super admin')] : null);
  els.accountName.title = [user.id, user.email].filter(Boolean).join(' · ');
}

const LOGIN_ERRORS = {
  link_invalid: 'This sign-in link is invalid, expired or was already used. Each link works once: ask the operator for a new one.',
  oidc_failed: 'Signing in with the identity provider failed.',
};

function loginView(ctx) {
  setTitle('Sign in');
  const next = safeNext(ctx.params.get('next'));
  const error = ctx.params.get('error');
  const message = ctx.params.get('message');
  const errorBox = error
    ? h('div', { class: 'alert-box', role: 'alert', testid: 'login-error' },
      h('p', {},
        h('strong', {}, 'Not signed in: '),
        LOGIN_ERRORS[error] ?? `Signing in failed (${error}).`,
        message ? [' ', h('span', { class: 'login-error-detail' }, `The provider said: ${message}`)] : null))
    : null;
  const providers = session.providers;
  mount(h('section', { class: 'signin card', testid: 'login-page', 'aria-labelledby': 'signin-heading' },
    h('h1', { tabindex: -1, id: 'signin-heading' }, 'Sign in'),
    errorBox,
    h('p', {}, 'Sign in to reach your projects and notebooks.'),
    providers.length
      ? h('ul', { class: 'providers', testid: 'provider-list' }, providers.map((p) => h('li', {},
        // A full-page navigation: the provider's sign-in page is not ours to fetch.
        h('a', {
          class: 'button',
          href: `/auth/oidc/${enc(p.name)}?next=${enc(next)}`,
          testid: 'provider-link',
          data: { provider: p.name },
        }, `Sign in with ${p.display_name || p.name}`))))
      : null,
    h('h2', {}, 'With a sign-in link'),
    h('p', {},
      'The hub\'s operator can give you a one-time sign-in link: they run ',
      h('code', {}, 'unicas-hub user login-link USER_ID'),
      ' on the hub\'s machine, which prints an address like ',
      h('code', {}, `${window.location.origin}/auth/link/…`),
      '. Open it in this browser and press Sign in; each link works once and expires soon.')));
}

async function logout() {
  try {
    await api('POST', '/auth/logout');
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) {
      showError(err);
      return;
    }
  }
  setSession({ user: null, csrf: null });
  renderAccount();
  clearAlert();
  navigate('/login');
}

/* ------------------------------------------------------------------------------------------ */
/* Not found                                                                                   */
/* ------------------------------------------------------------------------------------------ */

function notFoundView() {
  setTitle('Not found');
  mount(h('section', { class: 'not-found', testid: 'not-found', 'aria-labelledby': 'not-found-heading' },
    h('h1', { tabindex: -1, id: 'not-found-heading' }, 'Not found'),
    h('p', {}, 'There is nothing at this address, or you do not have access to it.'),
    h('p', {}, h('a', { href: '/' }, 'Go to your projects'))));
}

/* ------------------------------------------------------------------------------------------ */

setRouter({ route, renderAccount });

async function start() {
  els.logout.addEventListener('click', logout);
  bindSkeleton();
  document.addEventListener('click', interceptLinks);
  window.addEventListener('popstate', () => route());
  try {
    await loadSession();
  } catch (err) {
    mount(h('h1', { tabindex: -1 }, 'UniCAS hub'), h('p', {}, 'The hub could not tell who you are: its sign-in service did not answer.'));
    showError(err);
    return;
  }
  route({ initial: true });
}

start();
