// The hub's API as the UI calls it: the fetch wrapper (the browser's cookie, the CSRF token,
// envelopes, errors), cursor-paged lists, API paths, user ids as names, the hub's features,
// a file's bytes with a size limit, and uploads with progress.

import { ApiError, errorText, h, parseJson, request } from './common.js';
import { session } from './state.js';
import { enc, encPath } from './nav.js';

export const PAGE_LIMIT = 100;
// Sessions are counted over at most this many pages of the project's live sessions.
const SESSION_PAGES = 10;

/**
 * A path under /api/v1, unless it already starts with /api/ (as an app visit's heartbeat URL
 * does) or is one of the browser session's own routes (/auth/session, /auth/logout).
 */
const BROWSER_AUTH = new Set(['/auth/session', '/auth/logout']);
export const apiUrl = (path) => new URL(path.startsWith('/api/') || BROWSER_AUTH.has(path) ? path : `/api/v1${path}`, window.location.origin);

/** Turns a failed answer into an ApiError with the envelope's code and message. */
function errorOf(response, text) {
  const env = parseJson(text);
  const e = env?.error && typeof env.error === 'object' ? env.error : null;
  const retry = Number(response.headers.get('Retry-After'));
  return new ApiError(response.status,
    e?.code ?? (typeof env?.error === 'string' ? env.error : `HTTP_${response.status}`),
    e?.message ?? env?.message ?? errorText(text, response.statusText),
    e ?? {},
    Number.isFinite(retry) && retry > 0 ? retry : null);
}

/**
 * Calls the hub's API with the browser's cookie. `query` entries that are empty are left out;
 * `json` is sent as JSON, or `body` with `contentType`. Every request other than GET/HEAD
 * carries the CSRF token. Resolves the envelope's `data`; rejects with ApiError carrying the
 * API's code and message (`main: true` marks the page's main resource, whose 404 shows the
 * Not found page). A 401 sends the browser to the sign-in page.
 */
export async function api(method, path, { query, json, body, contentType, main = false, signal } = {}) {
  const response = await request(apiUrl(path), method, {
    query, json, body, contentType, signal, csrfToken: session.csrf, unreachable: 'The hub could not be reached',
  });
  const text = await response.text();
  if (response.ok) {
    let env = null;
    try {
      env = text ? JSON.parse(text) : null;
    } catch {
      throw new ApiError(response.status, 'BAD_RESPONSE', 'The hub answered something that is not JSON.');
    }
    if (env && typeof env === 'object' && 'success' in env) {
      if (env.success) return env.data;
    } else {
      return env;
    }
  }
  const err = errorOf(response, text);
  err.main = main;
  throw err;
}

/** Every page of a cursor-paged list (at most `maxPages`), concatenated. */
export async function allPages(path, { maxPages = SESSION_PAGES, limit = 1000 } = {}) {
  let items = [];
  let cursor = null;
  for (let i = 0; i < maxPages; i += 1) {
    const page = await api('GET', path, { query: { limit, cursor } });
    items = items.concat(page.items ?? []);
    cursor = page.next_cursor ?? null;
    if (!cursor) break;
  }
  return items;
}

export const projectApi = (pid, rest = '') => `/projects/${enc(pid)}${rest}`;
export const notebookApi = (pid, nid, rest = '') => `/projects/${enc(pid)}/notebooks/${enc(nid)}${rest}`;

/** The address of a file's bytes at a revision (head when null). */
export function fileApiUrl(pid, nid, path, rev) {
  const url = `/api/v1${notebookApi(pid, nid, `/workspace/files/${encPath(path)}`)}`;
  return rev != null ? `${url}?revision=${enc(rev)}` : url;
}

/** Display names of user ids, read in batches of 100 and kept for the page's life. */
const identities = new Map();

export async function resolveUsers(ids) {
  const missing = [...new Set(ids.filter((id) => id && !identities.has(id)))];
  for (let i = 0; i < missing.length; i += 100) {
    const chunk = missing.slice(i, i + 100);
    try {
      const list = await api('GET', '/users', { query: { ids: chunk.join(',') } });
      for (const id of chunk) identities.set(id, null);
      for (const u of list ?? []) identities.set(u.id, u);
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) throw err;
      // Names are a courtesy: the ids stand in for them.
    }
  }
}

/** A user id as its display name, the id (and email) in the tooltip. */
export function person(id, testid) {
  if (!id) return h('span', { testid }, '—');
  const who = identities.get(id);
  const title = who ? [id, who.email].filter(Boolean).join(' · ') : id;
  return h('span', { class: 'person', title, testid, data: { userId: id } }, who?.name || id);
}
export const personName = (id) => identities.get(id)?.name || id || '—';

let systemInfo = null;
/** GET /api/v1/system once; features default to on when it cannot be read. */
export async function system() {
  if (!systemInfo) {
    systemInfo = api('GET', '/system').catch(() => ({ features: {} }));
  }
  return systemInfo;
}
export const feature = (sys, name) => sys?.features?.[name] !== false;

/** A catch handler that answers `fallback`, except for a 401 (which must sign in again). */
export const rethrow401 = (fallback) => (err) => {
  if (err instanceof ApiError && err.status === 401) throw err;
  return fallback;
};

/**
 * Reads a file's bytes (at most `maxBytes`): { text, size } for UTF-8 text, { binary, size }
 * otherwise, { tooLarge, size } past the limit. API errors reject with ApiError.
 */
export async function fetchContent(url, maxBytes) {
  const controller = new AbortController();
  let response;
  try {
    response = await fetch(url, { credentials: 'same-origin', signal: controller.signal });
  } catch (err) {
    throw new ApiError(0, 'NETWORK_ERROR', `The hub could not be reached: ${err.message}`);
  }
  if (!response.ok) throw errorOf(response, await response.text());
  const declared = Number(response.headers.get('Content-Length'));
  if (Number.isFinite(declared) && declared > maxBytes) {
    controller.abort();
    return { tooLarge: true, size: declared };
  }
  const chunks = [];
  let total = 0;
  const reader = response.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (total > maxBytes) {
      controller.abort();
      return { tooLarge: true, size: Number.isFinite(declared) ? declared : null };
    }
    chunks.push(value);
  }
  const buffer = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    buffer.set(c, at);
    at += c.byteLength;
  }
  let text;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(buffer);
  } catch {
    return { binary: true, size: total };
  }
  if (text.includes('\u0000')) return { binary: true, size: total };
  return { text, size: total };
}

/**
 * Uploads `file` with XMLHttpRequest, for its upload progress; resolves the envelope's data.
 */
export function uploadWithProgress(url, file, contentType, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open('POST', url);
    xhr.setRequestHeader('Content-Type', contentType);
    xhr.setRequestHeader('Accept', 'application/json');
    if (session.csrf) xhr.setRequestHeader('X-CSRF-Token', session.csrf);
    xhr.upload.addEventListener('progress', (e) => {
      if (e.lengthComputable) onProgress(e.loaded, e.total);
    });
    xhr.addEventListener('load', () => {
      const text = xhr.responseText ?? '';
      const env = parseJson(text);
      if (xhr.status >= 200 && xhr.status < 300 && env?.success) {
        resolve(env.data);
        return;
      }
      const e = env?.error ?? {};
      reject(new ApiError(xhr.status, e.code ?? `HTTP_${xhr.status}`, e.message ?? errorText(text, xhr.statusText, 'The upload failed'), e));
    });
    xhr.addEventListener('error', () => reject(new ApiError(0, 'NETWORK_ERROR', 'The upload was interrupted: the hub could not be reached.')));
    xhr.addEventListener('abort', () => reject(new ApiError(0, 'ABORTED', 'The upload was cancelled.')));
    xhr.send(file);
  });
}
