// Helpers of the hub UI's browser test (hub-ui.mjs, which documents the environment): the
// environment, steps and their failure diagnostics, waiting and asserting, pages and
// screenshots, signing in, the API with the owner's token, and the accessibility checks.

import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';

const STEP_TIMEOUT_MS = 15_000;
export const EDITOR_TIMEOUT_MS = 120_000;
export const TOTAL_TIMEOUT_MS = 480_000;
export const DESKTOP = { width: 1280, height: 900 };
export const SMALLEST = { width: 360, height: 740 };

function requireEnv(name) {
  const value = process.env[name];
  if (!value) fail(`environment variable ${name} is not set`);
  return value;
}

export function fail(message) {
  console.error(`hub-ui: FAILED: ${message}`);
  process.exit(1);
}

/** Like fail, once the browser has been closed. */
export async function abort(message) {
  await browser?.close().catch(() => {});
  fail(message);
}

export const env = {
  base: requireEnv('HUB_BASE').replace(/\/$/, ''),
  ownerLink: requireEnv('OWNER_LOGIN_LINK'),
  viewerLink: requireEnv('VIEWER_LOGIN_LINK'),
  outsiderLink: requireEnv('OUTSIDER_LOGIN_LINK'),
  ownerToken: requireEnv('OWNER_TOKEN'),
  viewerId: requireEnv('VIEWER_ID'),
  sessions: process.env.SESSIONS === '1',
  // The sessions' own origin, when the hub serves them on one (UNICAS_HUB_SESSION_LISTEN).
  sessionOrigin: process.env.SESSION_ORIGIN ? process.env.SESSION_ORIGIN.replace(/\/$/, '') : null,
  screenshotDir: process.env.SCREENSHOT_DIR || null,
  chromium: process.env.CHROMIUM || '/usr/bin/chromium',
};

/** A CSS attribute selector with a safely quoted value. */
export const attr = (name, value) => `[${name}="${String(value).replace(/["\\]/g, '\\$&')}"]`;
export const testid = (id) => attr('data-testid', id);

export class StepError extends Error {}

export function assert(condition, message) {
  if (!condition) throw new StepError(message);
}

/**
 * Polls `probe` until `accept(value)` holds, then returns the value; fails with `what` and the
 * last value seen. The UI loads asynchronously, so every check waits for its state.
 */
export async function waitFor(what, probe, accept = Boolean, timeout = STEP_TIMEOUT_MS) {
  const deadline = Date.now() + timeout;
  let last;
  let lastError;
  for (;;) {
    try {
      last = await probe();
      lastError = undefined;
      if (accept(last)) return last;
    } catch (err) {
      lastError = err;
    }
    if (Date.now() > deadline) {
      const seen = lastError ? `error: ${lastError.message.split('\n')[0]}` : `last seen: ${JSON.stringify(last)}`;
      throw new StepError(`${what} (${seen})`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

export let browser;
export let page;
const pageErrors = [];
// Printed only when a step fails: a 401 before sign-in is logged here too, and is expected.
const consoleErrors = [];
export let stepNumber = 0;
// Addresses the owner visited, checked for accessibility by the last step.
export const visited = new Set();

/** Starts Chromium with the owner's page (`page`, in `browser`), at the desktop size. */
export async function launch() {
  if (env.screenshotDir) mkdirSync(env.screenshotDir, { recursive: true });
  browser = await chromium.launch({
    executablePath: env.chromium,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const context = await browser.newContext({ viewport: DESKTOP });
  page = await newPage(context);
}

export async function step(name, body) {
  stepNumber += 1;
  const started = Date.now();
  try {
    await body();
  } catch (err) {
    console.error(`hub-ui: not ok ${stepNumber} - ${name}`);
    await failureDiagnostics();
    await abort(`step "${name}": ${err instanceof StepError ? err.message : err.stack || err}`);
  }
  if (pageErrors.length) {
    console.error(`hub-ui: not ok ${stepNumber} - ${name}`);
    await abort(`step "${name}": uncaught error in the page: ${pageErrors.join('; ')}`);
  }
  console.log(`hub-ui: ok: ${name} (${Date.now() - started} ms)`);
}

export function skip(name, why) {
  stepNumber += 1;
  console.log(`hub-ui: skipped: ${name} (${why})`);
}

async function failureDiagnostics() {
  if (!page) return;
  try {
    console.error(`  at ${page.url()}`);
    for (const text of consoleErrors.slice(-10)) console.error(`  browser console: ${text}`);
    const alert = (await page.locator(testid('alert')).textContent({ timeout: 1000 }))?.trim();
    if (alert) console.error(`  alert region: ${alert}`);
    if (env.screenshotDir) {
      const file = path.join(env.screenshotDir, 'hub-failure.png');
      await page.screenshot({ path: file, fullPage: true, timeout: 5000 });
      console.error(`  screenshot: ${file}`);
    }
  } catch {
    // Diagnostics are best effort: the step's own error is what matters.
  }
}

export async function screenshot(name, target = page) {
  if (!env.screenshotDir) return;
  // The toast is transient; keep it out of the pictures.
  await target.locator(testid('status')).evaluate((el) => { el.classList.remove('visible'); });
  await target.screenshot({ path: path.join(env.screenshotDir, name), fullPage: true });
}

/** A page that records uncaught errors and console errors. */
export async function newPage(context) {
  const p = await context.newPage();
  p.setDefaultTimeout(STEP_TIMEOUT_MS);
  p.on('pageerror', (err) => pageErrors.push(`${err.message} (${p.url()})`));
  p.on('console', (msg) => {
    if (msg.type() === 'error') consoleErrors.push(`${msg.text()} (${msg.location().url})`);
  });
  return p;
}

export const url = (address) => `${env.base}${address}`;

export const textOf = (selector, target = page) => target.locator(selector).first().textContent({ timeout: 1000 }).then((t) => t?.trim());
export const countOf = (selector, target = page) => target.locator(selector).count();

/** Goes to an address of the UI and waits for its page heading to be rendered. */
export async function visit(address, { target = page, heading } = {}) {
  await target.goto(url(address));
  await waitFor(`the page ${address} to render its heading`, () => textOf('main h1', target),
    (t) => Boolean(t) && !/^Loading/.test(t) && (!heading || heading.test(t)));
  if (target === page) visited.add(address);
}

/** The API with the owner's token (the script's own calls: saves and checks). */
export async function ownerApi(method, apiPath, json) {
  const response = await fetch(`${env.base}/api/v1${apiPath}`, {
    method,
    headers: {
      Authorization: `Bearer ${env.ownerToken}`,
      Accept: 'application/json',
      ...(json !== undefined ? { 'Content-Type': 'application/json' } : {}),
    },
    body: json !== undefined ? JSON.stringify(json) : undefined,
  });
  const text = await response.text();
  let envelope;
  try {
    envelope = JSON.parse(text);
  } catch {
    throw new StepError(`${method} ${apiPath} answered ${response.status} with no JSON: ${text.slice(0, 200)}`);
  }
  if (!response.ok || !envelope.success) {
    throw new StepError(`${method} ${apiPath} answered ${response.status}: ${JSON.stringify(envelope.error ?? envelope)}`);
  }
  return envelope.data;
}

/**
 * Signs `target` in with a one-time login link. Opening the link may show a page whose Sign in
 * button uses it (a GET alone must not spend it: link previews), or sign in at once; either way
 * the browser lands on the projects page.
 */
export async function signIn(target, link, who) {
  const response = await target.goto(link);
  assert(response && response.ok(), `GET ${who}'s login link answered ${response?.status()}`);
  if (new URL(target.url()).pathname.startsWith('/auth/link/')) {
    await target.locator('#sign-in').click();
  }
  await waitFor(`${who}'s sign-in to land on the projects page`, () => new URL(target.url()).pathname, (p) => p === '/');
  await waitFor(`${who}'s projects page`, () => textOf('main h1', target), (t) => t === 'Projects');
}

/** Opens the confirmation dialog with `opener` and confirms it. */
export async function confirmWith(opener, target = page) {
  await opener.click();
  const dialog = target.locator(testid('confirm-dialog'));
  await dialog.waitFor({ state: 'visible', timeout: STEP_TIMEOUT_MS });
  await dialog.locator(testid('confirm-ok')).click();
  await dialog.waitFor({ state: 'hidden', timeout: STEP_TIMEOUT_MS });
}

export async function noHorizontalScroll(label) {
  const { scrollWidth, innerWidth } = await page.evaluate(() => ({
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
  }));
  assert(scrollWidth <= innerWidth, `${label}: the page scrolls sideways (${scrollWidth}px wide in a ${innerWidth}px viewport)`);
}

/**
 * Basic accessibility checks of the rendered page: labelled form controls, text alternatives
 * of images and SVGs, titled frames, named buttons, exactly one h1. Answers the problems found.
 */
export function accessibilityProblems(target = page) {
  return target.evaluate(() => {
    const problems = [];
    const describe = (el) => `${el.tagName.toLowerCase()}${el.dataset.testid ? `[data-testid=${el.dataset.testid}]` : ''}${el.id ? `#${el.id}` : ''}`;
    const named = (el) => {
      const label = el.getAttribute('aria-label');
      if (label && label.trim()) return true;
      const by = el.getAttribute('aria-labelledby');
      if (by && by.split(/\s+/).some((id) => document.getElementById(id)?.textContent.trim())) return true;
      return false;
    };
    for (const el of document.querySelectorAll('input, select, textarea')) {
      if (el.type === 'hidden' || el.closest('[aria-hidden="true"]')) continue;
      const labelled = [...(el.labels ?? [])].some((l) => l.textContent.trim()) || named(el);
      if (!labelled) problems.push(`${describe(el)} has no label`);
    }
    for (const img of document.querySelectorAll('img')) {
      if (!img.hasAttribute('alt')) problems.push(`${describe(img)} has no alt`);
    }
    for (const svg of document.querySelectorAll('svg')) {
      if (svg.closest('[aria-hidden="true"]')) continue;
      const titled = svg.querySelector(':scope > title')?.textContent.trim();
      if (!(named(svg) || titled)) problems.push(`${describe(svg)} has no text alternative`);
    }
    for (const frame of document.querySelectorAll('iframe')) {
      if (!frame.getAttribute('title')?.trim()) problems.push(`${describe(frame)} has no title`);
    }
    for (const button of document.querySelectorAll('button')) {
      if (button.closest('dialog:not([open])')) continue;
      if (!(button.textContent.trim() || named(button))) problems.push(`${describe(button)} has no name`);
    }
    const h1s = document.querySelectorAll('h1').length;
    if (h1s !== 1) problems.push(`${h1s} h1 elements (expected exactly one)`);
    if (document.documentElement.lang !== 'en') problems.push('the document has no lang="en"');
    return problems;
  });
}
