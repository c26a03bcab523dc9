// DOM helpers of the hub UI: the page's fixed elements, element builders (h, s), labelled
// fields, tables, breadcrumbs, busy buttons and forms, the alert region, the toast,
// screen-reader announcements, the confirmation dialog and copy buttons. Text always goes into
// the page as text nodes (never innerHTML): data from the API is hostile.

import { ApiError, session } from './state.js';
import { goLogin } from './nav.js';

export const els = {
  main: document.getElementById('main'),
  alerts: document.getElementById('alerts'),
  toast: document.getElementById('toast'),
  announcer: document.getElementById('announcer'),
  account: document.getElementById('account'),
  accountName: document.getElementById('account-name'),
  logout: document.getElementById('logout'),
  siteNav: document.getElementById('site-nav'),
  skipLink: document.getElementById('skip-link'),
  dialog: document.getElementById('confirm-dialog'),
  dialogTitle: document.getElementById('confirm-title'),
  dialogMessage: document.getElementById('confirm-message'),
  dialogOk: document.getElementById('confirm-ok'),
  dialogCancel: document.getElementById('confirm-cancel'),
};

/* ------------------------------------------------------------------------------------------ */
/* DOM helpers                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/**
 * Creates an element. Text always goes in as text nodes (never innerHTML), so data from the
 * API cannot inject markup. Props: class, testid, data (dataset), on<event> listeners,
 * value/checked as properties, anything else as an attribute (false/null/undefined: omitted).
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

const SVG_NS = 'http://www.w3.org/2000/svg';

/** An SVG element; attributes only (presentation attributes are allowed by the CSP). */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value == null || value === false) continue;
    if (key === 'class') el.setAttribute('class', value);
    else if (key === 'testid') el.setAttribute('data-testid', value);
    else el.setAttribute(key, String(value));
  }
  appendChildren(el, children);
  return el;
}

function appendChildren(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

let idSeq = 0;
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

/** A table inside a horizontally scrolling, keyboard-focusable region (narrow screens). */
export function dataTable({ testid, caption, head, rows, className }) {
  return h('div', { class: 'table-wrap', role: 'region', 'aria-label': caption, tabindex: 0 },
    h('table', { testid, class: className },
      h('caption', { class: 'visually-hidden' }, caption),
      h('thead', {}, h('tr', {}, head.map((c) => (c instanceof Node ? c : h('th', { scope: 'col' }, c))))),
      h('tbody', {}, rows)));
}

export const numTh = (label) => h('th', { scope: 'col', class: 'num' }, label);
export const hiddenTh = (label) => h('th', { scope: 'col' }, h('span', { class: 'visually-hidden' }, label));
export const loading = (text = 'Loading…') => h('p', { class: 'loading' }, text);

/** Replaces an element's children; like replaceChildren, but skips null/false (no "null" text). */
export function fill(el, ...children) {
  el.replaceChildren();
  appendChildren(el, children);
}

export const mount = (...children) => fill(els.main, ...children);

export function setTitle(...parts) {
  document.title = [...parts.filter(Boolean), 'UniCAS hub'].join(' · ');
}

/** A breadcrumb trail: [label, href] pairs, the last one the current page (no link). */
export function breadcrumbs(items) {
  const list = h('ol', {});
  items.forEach(([label, href], i) => {
    const last = i === items.length - 1;
    list.append(h('li', {}, last || !href
      ? h('span', { 'aria-current': last ? 'page' : null }, label)
      : h('a', { href }, label)));
  });
  return h('nav', { class: 'breadcrumbs', 'aria-label': 'Breadcrumb', testid: 'breadcrumbs' }, list);
}

/** Disables a button and shows `busyText` while `action` runs; restores it afterwards. */
export async function busy(button, busyText, action) {
  const label = button.textContent;
  button.disabled = true;
  button.setAttribute('aria-busy', 'true');
  button.textContent = busyText;
  try {
    return await action();
  } finally {
    if (button.isConnected) {
      button.disabled = false;
      button.removeAttribute('aria-busy');
      button.textContent = label;
    }
  }
}

/**
 * Runs `action` on submit with the submit buttons disabled (showing `busyText`); errors go to
 * the alert region. The browser's own validation (required, type=email, min/max) runs first.
 */
export function handleSubmit(form, action, busyText) {
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

export const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

async function copyText(text, done) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // The Clipboard API needs a secure context; plain http on a LAN address is not one.
    const area = h('textarea', { class: 'visually-hidden', readonly: true, 'aria-hidden': 'true', tabindex: -1 }, text);
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

/** A block of text (a secret, a command) with a Copy button. */
export function copyBlock(text, { testid, label, copyTestid, done = 'Copied to the clipboard.' }) {
  return h('div', { class: 'copy-block' },
    h('pre', { class: 'snippet', testid, tabindex: 0, role: 'region', 'aria-label': label }, text),
    h('button', { type: 'button', class: 'secondary small', testid: copyTestid, onclick: () => copyText(text, done) }, `Copy ${label.toLowerCase()}`));
}

/* ------------------------------------------------------------------------------------------ */
/* Messages: errors (alert), confirmations (toast), screen-reader announcements               */
/* ------------------------------------------------------------------------------------------ */

export function showError(err) {
  if (err instanceof ApiError && err.status === 401 && session.authMode !== 'none') {
    goLogin();
    return;
  }
  const message = err?.message || String(err);
  const code = err instanceof ApiError ? err.code : null;
  fill(els.alerts, h('div', { class: 'alert-box' },
    h('p', {},
      h('strong', {}, 'Error: '),
      h('span', { testid: 'alert-message' }, message),
      code && h('span', { class: 'alert-code', testid: 'alert-code' }, ` (${code})`)),
    h('button', { type: 'button', class: 'secondary small', onclick: clearAlert }, 'Dismiss')));
  els.alerts.scrollIntoView({ block: 'nearest' });
}

export function clearAlert() {
  fill(els.alerts);
}

let toastTimer = 0;
export function toast(text) {
  clearTimeout(toastTimer);
  fill(els.toast, h('p', {}, text));
  els.toast.classList.add('visible');
  toastTimer = setTimeout(() => {
    els.toast.classList.remove('visible');
    fill(els.toast);
  }, 6000);
}

export function announce(text) {
  els.announcer.textContent = text;
}

/* ------------------------------------------------------------------------------------------ */
/* Confirmation dialog                                                                         */
/* ------------------------------------------------------------------------------------------ */

/**
 * Asks for confirmation in the modal dialog; resolves true when confirmed. Escape, Cancel and
 * closing resolve false. Focus starts on Cancel (the harmless choice), stays inside the dialog
 * and returns to the element that opened it.
 */
export function confirmDialog({ title, message, confirmLabel = 'Confirm', danger = false }) {
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

export function trapDialogFocus(event) {
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

/** A "Load more" button for a cursor-paged list; hidden once there is no next cursor. */
export function loadMoreButton(label, testid, onLoad) {
  const button = h('button', { type: 'button', class: 'secondary', testid, hidden: true });
  button.textContent = label;
  button.addEventListener('click', async () => {
    clearAlert();
    try {
      await busy(button, 'Loading…', onLoad);
    } catch (err) {
      showError(err);
    }
  });
  return button;
}
