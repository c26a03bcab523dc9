// What the two web UIs of UniCAS share: the admin UI (admin-ui/, served at /admin/ui/) and the
// hub's UI (hub-ui/, served at /ui/). Each server serves this file beside its UI's own files, as
// ./common.js, so both import it with that relative specifier; web-common/base.css holds the
// styles they share. Plain ES module, no build step, and it imports nothing.
//
// Nothing here knows either app: what differs between them (the product's name in titles, what
// a 401 does, the shapes of the APIs' envelopes) comes in as parameters, and each app keeps its
// own API wrapper. Text always goes into the page as text nodes (never innerHTML): data from the
// APIs is hostile.

/* ------------------------------------------------------------------------------------------ */
/* DOM helpers                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/**
 * Creates an element. Text always goes in as text nodes (never innerHTML), so data from the
 * API cannot inject markup. Props: class, testid, data (dataset; null/undefined entries left
 * out), on<event> listeners, value/checked as properties, anything else as an attribute
 * (false/null/undefined: omitted).
 */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  appendChildren(el, children);
  // After the children, so that a <select>'s value can pick one of its options.
  for (const [key, value] of Object.entries(props ?? {})) {
    if (value == null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'testid') el.dataset.testid = value;
    else if (key === 'data') {
      for (const [k, v] of Object.entries(value)) if (v != null) el.dataset[k] = String(v);
    } else if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key === 'value' || key === 'checked') el[key] = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  return el;
}

/** Appends children (nested arrays flattened); null/false are skipped, the rest become text. */
export function appendChildren(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

let idSeq = 0;
/** A fresh element id, unique in the page. */
export const uid = (prefix) => `${prefix}-${++idSeq}`;

/** A labelled form field; the hint is tied to the control with aria-describedby. */
export function field(label, control, hint) {
  control.id ||= uid('field');
  let hintEl = null;
  if (hint) {
    hintEl = h('p', { class: 'hint', id: `${control.id}-hint` }, hint);
    control.setAttribute('aria-describedby', hintEl.id);
  }
  return h('div', { class: 'field' }, h('label', { for: control.id }, label), control, hintEl);
}

/**
 * A table inside a horizontally scrolling, keyboard-focusable region (narrow screens). `head`
 * holds column labels or ready <th> elements; `className` (optional) goes on the <table>.
 */
export function dataTable({ testid, caption, head, rows, className }) {
  return h('div', { class: 'table-wrap', role: 'region', 'aria-label': caption, tabindex: 0 },
    h('table', { testid, class: className },
      h('caption', { class: 'visually-hidden' }, caption),
      h('thead', {}, h('tr', {}, head.map((c) => (c instanceof Node ? c : h('th', { scope: 'col' }, c))))),
      h('tbody', {}, rows)));
}

export const numTh = (label) => h('th', { scope: 'col', class: 'num' }, label);
/** A column heading for screen readers only (a column of links or buttons). */
export const hiddenTh = (label) => h('th', { scope: 'col' }, h('span', { class: 'visually-hidden' }, label));
export const loading = (text = 'Loading…') => h('p', { class: 'loading' }, text);

/** Replaces an element's children; like replaceChildren, but skips null/false (no "null" text). */
export function fill(el, ...children) {
  el.replaceChildren();
  appendChildren(el, children);
}

/* ------------------------------------------------------------------------------------------ */
/* Formatting                                                                                  */
/* ------------------------------------------------------------------------------------------ */

const numberFormat = new Intl.NumberFormat();
const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'];
const dateTimeFormats = {
  minutes: new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'short' }),
  seconds: new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'medium' }),
};

export const formatCount = (n) => (typeof n === 'number' && Number.isFinite(n) ? numberFormat.format(n) : '—');

export function formatBytes(n) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return '—';
  let value = n;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < BYTE_UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  if (unit === 0) return `${numberFormat.format(n)} B`;
  const digits = Math.abs(value) < 10 ? 2 : Math.abs(value) < 100 ? 1 : 0;
  return `${value.toFixed(digits)} ${BYTE_UNITS[unit]}`;
}

/** Bytes, human-readable, with the exact count in a tooltip. */
export const bytes = (n, testid) =>
  h('span', { testid, title: typeof n === 'number' ? `${numberFormat.format(n)} bytes` : null }, formatBytes(n));

export const plural = (n, one, many = `${one}s`) => `${formatCount(n)} ${n === 1 ? one : many}`;

/** A Date as local date and time: to the minute, or with `seconds` to the second. */
export const formatDateTime = (date, { seconds = false } = {}) =>
  (seconds ? dateTimeFormats.seconds : dateTimeFormats.minutes).format(date);

/** A <time> showing `date` in local time, with `stamp` (the exact value) in datetime and the tooltip. */
export const timeElement = (date, stamp, { seconds = false, testid } = {}) =>
  h('time', { datetime: stamp, title: stamp, testid }, formatDateTime(date, { seconds }));

/* ------------------------------------------------------------------------------------------ */
/* API: what the two APIs' wrappers share (their envelopes differ and stay in each app)       */
/* ------------------------------------------------------------------------------------------ */

/** What an API call rejects with: the HTTP status (0: no answer), the API's code and message. */
export class ApiError extends Error {
  constructor(status, code, message, details = {}, retryAfter = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
    this.retryAfter = retryAfter;
  }
}

/** Sets the entries of `values` on `params` (URLSearchParams), leaving out null, undefined and ''. */
export function setParams(params, values) {
  for (const [key, value] of Object.entries(values ?? {})) {
    if (value != null && value !== '') params.set(key, String(value));
  }
  return params;
}

/**
 * Sends a request to `url` (a URL) with the browser's cookie and resolves the Response. `query`
 * entries that are empty are left out; `json` is sent as JSON, or `body` with `contentType`;
 * `csrfToken`, when set, goes with every method but GET and HEAD. A network failure rejects
 * with ApiError NETWORK_ERROR ("`unreachable`: why"); an abort (`signal`) with its AbortError.
 */
export async function request(url, method, { query, json, body, contentType, signal, csrfToken, unreachable } = {}) {
  setParams(url.searchParams, query);
  const headers = { Accept: 'application/json' };
  if (method !== 'GET' && method !== 'HEAD' && csrfToken) headers['X-CSRF-Token'] = csrfToken;
  let payload;
  if (json !== undefined) {
    headers['Content-Type'] = 'application/json';
    payload = JSON.stringify(json);
  } else if (body !== undefined) {
    headers['Content-Type'] = contentType;
    payload = body;
  }
  try {
    return await fetch(url, { method, headers, body: payload, credentials: 'same-origin', signal });
  } catch (err) {
    if (err?.name === 'AbortError') throw err;
    throw new ApiError(0, 'NETWORK_ERROR', `${unreachable}: ${err.message}`);
  }
}

/** The JSON value of an answer's text; null when it is empty or not JSON (a proxy's error page, say). */
export function parseJson(text) {
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    return null;
  }
}

/** The message of a failed answer without one of the API's: its text, else its status line. */
export const errorText = (text, statusText, fallback = 'Request failed') =>
  text.trim().slice(0, 300) || statusText || fallback;

/* ------------------------------------------------------------------------------------------ */
/* The page: its fixed elements and what writes into them                                     */
/* ------------------------------------------------------------------------------------------ */

/**
 * The fixed elements of the page skeleton both UIs' index.html share (header, alert region,
 * toast, live region, <main>, the confirmation dialog), by their ids.
 */
export function pageElements() {
  const byId = (id) => document.getElementById(id);
  return {
    main: byId('main'),
    alerts: byId('alerts'),
    toast: byId('toast'),
    announcer: byId('announcer'),
    account: byId('account'),
    accountName: byId('account-name'),
    logout: byId('logout'),
    siteNav: byId('site-nav'),
    skipLink: byId('skip-link'),
    dialog: byId('confirm-dialog'),
    dialogTitle: byId('confirm-title'),
    dialogMessage: byId('confirm-message'),
    dialogOk: byId('confirm-ok'),
    dialogCancel: byId('confirm-cancel'),
  };
}

/**
 * What writes into the page's fixed elements `els` (from pageElements()): the main region and
 * the title, errors (alert), results (toast), screen-reader announcements, the confirmation
 * dialog, forms, copying, and running a view. Options:
 * - `product`: the last part of every document title (e.g. 'UniCAS admin');
 * - `intercept(err)`: answers true when it dealt with an error itself (a 401: to sign-in), which
 *   then does not go to the alert region;
 * - `alertCodeTestid`: the data-testid of the error code in an alert (none when unset);
 * - `hideCopyArea`: whether the stand-in textarea of a copy without the Clipboard API is also
 *   hidden from assistive technology (aria-hidden) and the tab order.
 */
export function createPage(els, { product, intercept = () => false, alertCodeTestid = null, hideCopyArea = false }) {
  const mount = (...children) => fill(els.main, ...children);

  function setTitle(...parts) {
    document.title = [...parts.filter(Boolean), product].join(' · ');
  }

  /* Messages: errors (alert), confirmations (toast), screen-reader announcements */

  function showError(err) {
    if (intercept(err)) return;
    const message = err?.message || String(err);
    const code = err instanceof ApiError ? err.code : null;
    fill(els.alerts, h('div', { class: 'alert-box' },
      h('p', {},
        h('strong', {}, 'Error: '),
        h('span', { testid: 'alert-message' }, message),
        code && h('span', { class: 'alert-code', testid: alertCodeTestid }, ` (${code})`)),
      h('button', { type: 'button', class: 'secondary small', onclick: clearAlert }, 'Dismiss')));
    els.alerts.scrollIntoView({ block: 'nearest' });
  }

  function clearAlert() {
    fill(els.alerts);
  }

  let toastTimer = 0;
  function toast(text) {
    clearTimeout(toastTimer);
    fill(els.toast, h('p', {}, text));
    els.toast.classList.add('visible');
    toastTimer = setTimeout(() => {
      els.toast.classList.remove('visible');
      fill(els.toast);
    }, 6000);
  }

  function announce(text) {
    els.announcer.textContent = text;
  }

  /* Confirmation dialog */

  /**
   * Asks for confirmation in the modal dialog; resolves true when confirmed. Escape, Cancel and
   * closing resolve false. Focus starts on Cancel (the harmless choice), stays inside the dialog
   * and returns to the element that opened it.
   */
  function confirmDialog({ title, message, confirmLabel = 'Confirm', danger = false }) {
    const opener = document.activeElement;
    els.dialogTitle.textContent = title;
    fill(els.dialogMessage, typeof message === 'string' ? h('p', {}, message) : message);
    els.dialogOk.textContent = confirmLabel;
    els.dialogOk.classList.toggle('danger', danger);
    els.dialog.returnValue = '';
    els.dialog.showModal();
    els.dialogCancel.focus();
    return new Promise((resolve) => {
      els.dialog.addEventListener('close', () => {
        if (opener instanceof HTMLElement && opener.isConnected) opener.focus();
        resolve(els.dialog.returnValue === 'confirm');
      }, { once: true });
    });
  }

  function trapDialogFocus(event) {
    if (event.key !== 'Tab') return;
    const focusable = [...els.dialog.querySelectorAll('button, [href], input, select, textarea')]
      .filter((el) => !el.disabled);
    if (focusable.length === 0) return;
    const first = focusable[0];
    const last = focusable[focusable.length - 1];
    if (event.shiftKey && document.activeElement === first) {
      event.preventDefault();
      last.focus();
    } else if (!event.shiftKey && document.activeElement === last) {
      event.preventDefault();
      first.focus();
    }
  }

  /**
   * Wires the skeleton once at start-up: Tab stays inside the open dialog, and the skip link
   * moves focus to the main region without changing the address (which is the router's).
   */
  function bindSkeleton() {
    els.dialog.addEventListener('keydown', trapDialogFocus);
    els.skipLink.addEventListener('click', (event) => {
      event.preventDefault();
      els.main.focus();
    });
  }

  /* Forms and copying */

  /**
   * Runs `action` on submit with the submit buttons disabled (showing `busyText`, if given);
   * errors go to the alert region. The browser's own validation (required, type=email,
   * min/max) runs first.
   */
  function handleSubmit(form, action, busyText) {
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      const buttons = [...form.querySelectorAll('button[type=submit]')];
      const labels = buttons.map((b) => b.textContent);
      buttons.forEach((b) => {
        b.disabled = true;
        if (busyText) b.textContent = busyText;
      });
      clearAlert();
      try {
        await action(event);
      } catch (err) {
        showError(err);
      } finally {
        buttons.forEach((b, i) => {
          b.disabled = false;
          b.textContent = labels[i];
        });
      }
    });
  }

  /** Copies `text` to the clipboard and toasts `done`. */
  async function copyText(text, done) {
    try {
      await navigator.clipboard.writeText(text);
    } catch {
      // The Clipboard API needs a secure context; plain http on a LAN address is not one.
      const area = h('textarea', {
        class: 'visually-hidden', readonly: true, 'aria-hidden': hideCopyArea ? 'true' : null, tabindex: hideCopyArea ? -1 : null,
      }, text);
      document.body.append(area);
      area.select();
      const ok = document.execCommand('copy');
      area.remove();
      if (!ok) {
        showError(new Error('The browser refused to copy; select the text instead.'));
        return;
      }
    }
    toast(done);
  }

  /* Views */

  /**
   * Runs `view(ctx)` into the main region: clears the alert, marks main busy while the view
   * loads and moves focus to the new page's heading so that keyboard and screen-reader users
   * start there (not on the `initial` load, where the skip link comes first). When it fails and
   * the user has not moved on (`ctx.stale()`), `onFail(err)` may deal with the error (answering
   * true); otherwise what was loading is marked as failed and the error goes to the alert region.
   */
  async function runView(view, ctx, { initial = false, onFail = () => false } = {}) {
    clearAlert();
    els.main.setAttribute('aria-busy', 'true');
    let done;
    try {
      done = view(ctx);
    } catch (err) {
      done = Promise.reject(err);
    }
    if (!initial) els.main.querySelector('h1')?.focus();
    try {
      await done;
    } catch (err) {
      if (!ctx.stale() && !onFail(err)) {
        for (const el of els.main.querySelectorAll('.loading')) el.replaceWith(h('p', { class: 'empty' }, 'This could not be loaded.'));
        showError(err);
      }
    } finally {
      if (!ctx.stale()) els.main.removeAttribute('aria-busy');
    }
  }

  return {
    mount, setTitle, showError, clearAlert, toast, announce, confirmDialog, bindSkeleton, handleSubmit, copyText, runView,
  };
}
