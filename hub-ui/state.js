// The hub UI's shared state, at the bottom of its modules (this one imports nothing): the
// browser session and the sync token a notebook create hands to that notebook's page. (The
// error every API call rejects with, ApiError, is common.js's.)

/**
 * The browser session: { user, csrf, authMode, providers, sessionOrigin }, from
 * GET /auth/session. `sessionOrigin`: where notebook sessions are served when they have an
 * origin of their own (else null: under /s/ of this origin).
 */
export const session = { user: null, csrf: null, authMode: 'token', providers: [], sessionOrigin: null };

/** Changes fields of the session; it stays one object, which every module reads. */
export function setSession(fields) {
  Object.assign(session, fields);
}

/** A sync token answered by a notebook create, shown once on that notebook's page. */
let freshSyncToken = null;

/** Keeps `{ nid, token }` for that notebook's page. */
export function setFreshSyncToken(value) {
  freshSyncToken = value;
}

/** The kept `{ nid, token }` when it is notebook `nid`'s, once: taking it forgets it. */
export function takeFreshSyncToken(nid) {
  if (freshSyncToken?.nid !== nid) return null;
  const fresh = freshSyncToken;
  freshSyncToken = null;
  return fresh;
}
