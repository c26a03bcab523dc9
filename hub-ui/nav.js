// Addresses of the hub UI and moving between them: encoding, the UI's own addresses
// (/projects/…), the History API navigation and the way to the sign-in page. The router (the
// table of views) is app.js's, which registers it here with setRouter: views navigate through
// this module without importing app.js, and this module imports no view.

import { setParams } from './common.js';
import { setSession } from './state.js';

export const enc = encodeURIComponent;
export const encPath = (path) => String(path).split('/').map(enc).join('/');

/** What app.js registers: its router, and what redraws the header's account. */
const router = { route: () => {}, renderAccount: () => {} };

/** Called once by app.js with its `route({ initial })` and `renderAccount()`. */
export function setRouter({ route, renderAccount }) {
  router.route = route;
  router.renderAccount = renderAccount;
}

/** Addresses the UI answers (everything else, /api/, /auth/, /s/, is a real navigation). */
export function isUiPath(path) {
  return path === '/' || path === '/login' || path === '/tokens' || path === '/projects'
    || path.startsWith('/projects/');
}

/** `/a/b/c` from segments, each one encoded; `query` entries that are empty are left out. */
function href(segments, query = {}) {
  const q = setParams(new URLSearchParams(), query).toString();
  return `/${segments.map(enc).join('/')}${q ? `?${q}` : ''}`;
}

export const projectHref = (pid, tab) => href(['projects', pid, ...(tab ? [tab] : [])]);
export const notebookHref = (pid, nid, rest, query) => href(['projects', pid, 'notebooks', nid, ...(rest ? [rest] : [])], query);
export function fileHref(pid, nid, path, rev) {
  const base = `${notebookHref(pid, nid, 'files')}/${encPath(path)}`;
  return rev != null ? `${base}?rev=${enc(rev)}` : base;
}
export const filesHref = (pid, nid, rev) => notebookHref(pid, nid, 'files', { rev });
export const diffHref = (pid, nid, from, to, view) => notebookHref(pid, nid, 'diff', { from, to, view });

export function parseRoute() {
  let segments;
  try {
    segments = window.location.pathname.split('/').filter(Boolean).map(decodeURIComponent);
  } catch {
    segments = ['invalid address'];
  }
  return { segments, params: new URLSearchParams(window.location.search) };
}

/** Only an address of this UI may be the `next` of a sign-in (no open redirect). */
export function safeNext(next) {
  if (!next || !next.startsWith('/') || next.startsWith('//') || next.startsWith('/\\')) return '/';
  try {
    const url = new URL(next, window.location.origin);
    return url.origin === window.location.origin && isUiPath(url.pathname) && url.pathname !== '/login'
      ? url.pathname + url.search
      : '/';
  } catch {
    return '/';
  }
}

export function navigate(to, { replace = false } = {}) {
  const url = new URL(to, window.location.href);
  if (replace) window.history.replaceState(null, '', url);
  else window.history.pushState(null, '', url);
  router.route();
}

/** To the sign-in page, remembering the address asked for. */
export function goLogin() {
  const { pathname, search } = window.location;
  const next = pathname === '/login'
    ? new URLSearchParams(search).get('next')
    : (isUiPath(pathname) ? pathname + search : null);
  setSession({ user: null, csrf: null });
  router.renderAccount();
  const safe = next ? safeNext(next) : '/';
  window.history.replaceState(null, '', safe === '/' ? '/login' : `/login?next=${enc(safe)}`);
  router.route();
}
