// DOM helpers of the hub UI: the page's fixed elements and what writes into them (the main
// region, the title, the alert region, the toast, screen-reader announcements, the confirmation
// dialog, forms; made by common.js's createPage for this page), SVG elements, breadcrumbs, busy
// buttons, copy buttons and "Load more". The element builders (h, fields, tables) that the
// admin UI shares are in common.js. Text always goes into the page as text nodes (never
// innerHTML): data from the API is hostile.

import { ApiError, appendChildren, createPage, h, pageElements } from './common.js';
import { session } from './state.js';
import { goLogin } from './nav.js';

export const els = pageElements();

const page = createPage(els, {
  product: 'UniCAS hub',
  // A 401 goes to the sign-in page (when the hub has one).
  intercept: (err) => {
    if (!(err instanceof ApiError && err.status === 401 && session.authMode !== 'none')) return false;
    goLogin();
    return true;
  },
  alertCodeTestid: 'alert-code',
  hideCopyArea: true,
});

export const {
  announce, bindSkeleton, clearAlert, confirmDialog, handleSubmit, mount, runView, setTitle, showError, toast,
} = page;

/* ------------------------------------------------------------------------------------------ */
/* DOM helpers                                                                                 */
/* ------------------------------------------------------------------------------------------ */

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

export const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

/** A block of text (a secret, a command) with a Copy button. */
export function copyBlock(text, { testid, label, copyTestid, done = 'Copied to the clipboard.' }) {
  return h('div', { class: 'copy-block' },
    h('pre', { class: 'snippet', testid, tabindex: 0, role: 'region', 'aria-label': label }, text),
    h('button', { type: 'button', class: 'secondary small', testid: copyTestid, onclick: () => page.copyText(text, done) }, `Copy ${label.toLowerCase()}`));
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
