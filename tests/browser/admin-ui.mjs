// Drives the UniCAS admin UI end to end in headless Chromium and exits non-zero on the first
// failed step, saying what failed.
//
// Environment (set by the Rust test that starts the server and seeds the data):
//   ADMIN_LOGIN_LINK  one-time sign-in URL; a GET signs in and redirects to /admin/ui/
//   ADMIN_BASE        the server, e.g. http://127.0.0.1:PORT
//   APP_ID, SPACE_ID  the seeded App and Space
//   HASH_A, HASH_B    hashes with balances in SPACE_ID: HASH_A at 2, HASH_B at 1
//   SCREENSHOT_DIR    where to save PNGs (optional: no screenshots when unset)
//   CHROMIUM          the browser (default /usr/bin/chromium)

import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';

const STEP_TIMEOUT_MS = 15_000;
const TOTAL_TIMEOUT_MS = 180_000;
const DESKTOP = { width: 1280, height: 800 };
const NARROW = { width: 390, height: 844 };
const SMALLEST = { width: 360, height: 740 };

function requireEnv(name) {
  const value = process.env[name];
  if (!value) fail(`environment variable ${name} is not set`);
  return value;
}

function fail(message) {
  console.error(`admin-ui: FAILED: ${message}`);
  process.exit(1);
}

/** Like fail, once the browser has been closed. */
async function abort(message) {
  await browser?.close().catch(() => {});
  fail(message);
}

const env = {
  loginLink: requireEnv('ADMIN_LOGIN_LINK'),
  base: requireEnv('ADMIN_BASE').replace(/\/$/, ''),
  appId: requireEnv('APP_ID'),
  spaceId: requireEnv('SPACE_ID'),
  hashA: requireEnv('HASH_A'),
  hashB: requireEnv('HASH_B'),
  screenshotDir: process.env.SCREENSHOT_DIR || null,
  chromium: process.env.CHROMIUM || '/usr/bin/chromium',
};

/** A CSS attribute selector with a safely quoted value. */
const attr = (name, value) => `[${name}="${String(value).replace(/["\\]/g, '\\$&')}"]`;
const testid = (id) => attr('data-testid', id);

class StepError extends Error {}

function assert(condition, message) {
  if (!condition) throw new StepError(message);
}

/**
 * Polls `probe` until `accept(value)` holds, then returns the value; fails with `what` and the
 * last value seen. The UI loads asynchronously, so every check waits for its state.
 */
async function waitFor(what, probe, accept = Boolean, timeout = STEP_TIMEOUT_MS) {
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

const parseCount = (text) => Number(String(text).replace(/[^\d+-]/g, ''));

let browser;
let page;
const pageErrors = [];
// Printed only when a step fails: a 401 on the sign-in page is logged here too, and is expected.
const consoleErrors = [];
let stepNumber = 0;

async function step(name, body) {
  stepNumber += 1;
  const started = Date.now();
  try {
    await body();
  } catch (err) {
    console.error(`not ok ${stepNumber} - ${name}`);
    await failureDiagnostics();
    await abort(`step "${name}": ${err instanceof StepError ? err.message : err.stack || err}`);
  }
  if (pageErrors.length) {
    console.error(`not ok ${stepNumber} - ${name}`);
    await abort(`step "${name}": uncaught error in the page: ${pageErrors.join('; ')}`);
  }
  console.log(`ok ${stepNumber} - ${name} (${Date.now() - started} ms)`);
}

async function failureDiagnostics() {
  if (!page) return;
  try {
    console.error(`  at ${page.url()}`);
    for (const text of consoleErrors.slice(-10)) console.error(`  browser console: ${text}`);
    const alert = (await page.locator(testid('alert')).textContent({ timeout: 1000 }))?.trim();
    if (alert) console.error(`  alert region: ${alert}`);
    if (env.screenshotDir) {
      const file = path.join(env.screenshotDir, 'failure.png');
      await page.screenshot({ path: file, fullPage: true, timeout: 5000 });
      console.error(`  screenshot: ${file}`);
    }
  } catch {
    // Diagnostics are best effort: the step's own error is what matters.
  }
}

async function screenshot(name) {
  if (!env.screenshotDir) return;
  // The toast is transient; keep it out of the pictures.
  await page.locator(testid('status')).evaluate((el) => { el.classList.remove('visible'); });
  await page.screenshot({ path: path.join(env.screenshotDir, name), fullPage: true });
}

const uiUrl = (hash) => `${env.base}/admin/ui/${hash}`;
const appRow = () => page.locator(`${testid('app-row')}${attr('data-app-id', env.appId)}`);
const textOf = (selector) => page.locator(selector).first().textContent({ timeout: 1000 }).then((t) => t?.trim());

async function gotoTab(tab) {
  await page.locator(testid(`tab-${tab}`)).click();
  await waitFor(`the ${tab} tab to open`, () => page.locator(`${testid(`tab-${tab}`)}[aria-current="page"]`).count(), (n) => n === 1);
}

/** Filters the balances listing by SPACE_ID and `hash`; resolves the count shown for it. */
async function balanceOf(hash) {
  await page.locator(testid('filter-space')).fill(env.spaceId);
  await page.locator(testid('filter-hash')).fill(hash);
  await page.locator(testid('filter-submit')).click();
  const rows = page.locator(testid('balance-row'));
  const hashes = await waitFor(`the balances listing to show only ${hash}`,
    () => rows.evaluateAll((els) => els.map((el) => el.dataset.hash)),
    (list) => list.length > 0 && list.every((h) => h === hash));
  assert(hashes.length === 1, `expected one balance row for ${hash} in ${env.spaceId}, got ${hashes.length}`);
  const row = page.locator(`${testid('balance-row')}${attr('data-hash', hash)}${attr('data-space-id', env.spaceId)}`);
  return parseCount(await row.locator(testid('balance-count')).textContent());
}

/** Opens the confirmation dialog with `opener` and confirms it. */
async function confirmWith(opener) {
  await opener.click();
  const dialog = page.locator(testid('confirm-dialog'));
  await dialog.waitFor({ state: 'visible', timeout: STEP_TIMEOUT_MS });
  await dialog.locator(testid('confirm-ok')).click();
  await dialog.waitFor({ state: 'hidden', timeout: STEP_TIMEOUT_MS });
}

async function noHorizontalScroll(label) {
  const { scrollWidth, innerWidth } = await page.evaluate(() => ({
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
  }));
  assert(scrollWidth <= innerWidth, `${label}: the page scrolls sideways (${scrollWidth}px wide in a ${innerWidth}px viewport)`);
}

async function main() {
  if (env.screenshotDir) mkdirSync(env.screenshotDir, { recursive: true });
  browser = await chromium.launch({
    executablePath: env.chromium,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const context = await browser.newContext({ viewport: DESKTOP });
  page = await context.newPage();
  page.setDefaultTimeout(STEP_TIMEOUT_MS);
  page.on('pageerror', (err) => pageErrors.push(err.message));
  page.on('console', (msg) => {
    if (msg.type() === 'error') consoleErrors.push(`${msg.text()} (${msg.location().url})`);
  });

  await step('the login link signs in and lands on the Apps page', async () => {
    const response = await page.goto(env.loginLink);
    assert(response && response.ok(), `GET the login link answered ${response?.status()}`);
    // Opening the link only shows a page; its button uses the link.
    await page.click('#sign-in');
    await waitFor('the URL to be the Apps page', () => page.url(), (u) => u.startsWith(uiUrl('#/apps')));
    await waitFor(`the Apps table to list ${env.appId}`, () => appRow().count(), (n) => n === 1);
    const account = await textOf(testid('account-name'));
    assert(account, 'the signed-in account is not shown');
  });

  await step('the Apps page shows the App with its usage', async () => {
    const nodes = await appRow().locator(testid('app-usage-nodes')).textContent();
    assert(Number.isFinite(parseCount(nodes)) && nodes.trim() !== '—', `node count of ${env.appId} is "${nodes}"`);
    const content = (await appRow().locator(testid('app-usage-content')).textContent()).trim();
    assert(/^[\d.,]+\s(B|KiB|MiB|GiB|TiB|PiB|EiB)$/.test(content), `ready content of ${env.appId} is not a byte size: "${content}"`);
    const status = (await appRow().textContent());
    assert(/Active|Suspended/.test(status), `the App's status is not shown: "${status}"`);
    await screenshot('apps.png');
  });

  await step('keyboard: the skip link comes first, and Tab then Enter on the App link opens it', async () => {
    await page.reload();
    await waitFor(`the Apps table to list ${env.appId}`, () => appRow().count(), (n) => n === 1);
    await page.keyboard.press('Tab');
    const first = await page.evaluate(() => document.activeElement?.dataset.testid);
    assert(first === 'skip-link', `the first Tab stop is ${first}, not the skip link`);
    const link = `${testid('app-link')}${attr('data-app-id', env.appId)}`;
    let onLink = false;
    for (let i = 0; i < 40 && !onLink; i += 1) {
      await page.keyboard.press('Tab');
      onLink = await page.evaluate((sel) => document.activeElement?.matches(sel) ?? false, link);
    }
    assert(onLink, `Tab never reached the link of ${env.appId}`);
    const outline = await page.evaluate(() => getComputedStyle(document.activeElement).outlineStyle);
    assert(outline !== 'none', 'the focused App link has no visible focus outline');
    await page.keyboard.press('Enter');
    await waitFor('Enter to open the App overview', () => page.url(), (u) => u.endsWith(`#/apps/${encodeURIComponent(env.appId)}`));
    await waitFor('the App title', () => textOf(testid('app-title')), (t) => t === env.appId);
  });

  await step('the App overview shows status, usage and the Space', async () => {
    await waitFor('the App status', () => textOf(testid('app-status')), (t) => t === 'Active' || t === 'Suspended');
    await waitFor('the usage', () => textOf(testid('usage-nodes')), (t) => t && t !== '—');
    const spaces = await page.locator(testid('space-item')).evaluateAll((els) => els.map((el) => el.dataset.spaceId));
    assert(spaces.includes(env.spaceId), `the Spaces list ${JSON.stringify(spaces)} lacks ${env.spaceId}`);
    await screenshot('app.png');
  });

  await step('balances: the hash filter finds HASH_A with count 2, at a revision', async () => {
    await gotoTab('balances');
    await waitFor('the balances table', () => page.locator(testid('balance-row')).count(), (n) => n > 0);
    const count = await balanceOf(env.hashA);
    assert(count === 2, `HASH_A's count is ${count}, expected 2`);
    const revision = await textOf(testid('listing-revision'));
    assert(/^\d[\d,.\s]*$/.test(revision ?? ''), `the listing's revision is not shown ("${revision}")`);
    await screenshot('balances.png');
  });

  await step('balances: a malformed hash filter is reported in the alert region', async () => {
    await page.locator(testid('filter-hash')).fill('not-a-hash');
    await page.locator(testid('filter-submit')).click();
    await waitFor('an error in the alert region', () => textOf(testid('alert')), (t) => /hash/i.test(t ?? ''));
    const invalid = await page.locator(testid('filter-hash')).getAttribute('aria-invalid');
    assert(invalid === 'true', 'the hash field is not marked aria-invalid');
  });

  await step('events: an event expands to show its changes', async () => {
    await gotoTab('events');
    await waitFor('the events table', () => page.locator(testid('event-row')).count(), (n) => n > 0);
    const toggle = page.locator(testid('event-toggle')).first();
    await toggle.click();
    assert(await toggle.getAttribute('aria-expanded') === 'true', 'the event toggle is not aria-expanded after a click');
    const changes = page.locator(`${testid('event-changes')}:not([hidden])`).first();
    await changes.waitFor({ state: 'visible' });
    const rows = await changes.locator(testid('change-row')).evaluateAll((els) => els.map((el) => ({
      hash: el.dataset.hash, delta: el.querySelector('[data-testid="change-delta"]')?.textContent.trim(),
    })));
    assert(rows.length > 0, 'the expanded event lists no change');
    assert(rows.every((r) => /^[0-9a-f]{64}$/.test(r.hash) && /^[+-]?\d/.test(r.delta)), `malformed changes: ${JSON.stringify(rows)}`);
    const revision = await textOf(testid('listing-revision'));
    assert(revision, 'the events listing does not show its revision');
    await screenshot('events.png');
  });

  await step('reconcile: pasted CSV shows exactly one difference (HASH_B: 3 intended, 1 actual, +2)', async () => {
    await gotoTab('reconcile');
    await page.locator(testid('reconcile-watermark')).fill('browser-test-1');
    await page.locator(testid('reconcile-input')).fill(`${env.spaceId},${env.hashA},2\n${env.spaceId},${env.hashB},3\n`);
    await page.locator(testid('reconcile-submit')).click();
    await waitFor('the comparison summary', () => textOf(testid('reconcile-summary')), Boolean);
    const rows = await page.locator(testid('diff-row')).evaluateAll((els) => els.map((el) => ({
      spaceId: el.dataset.spaceId,
      hash: el.dataset.hash,
      intended: el.querySelector('[data-testid="diff-intended"]').textContent,
      actual: el.querySelector('[data-testid="diff-actual"]').textContent,
      delta: el.querySelector('[data-testid="diff-delta"]').textContent,
    })));
    assert(rows.length === 1, `expected exactly one difference, got ${rows.length}: ${JSON.stringify(rows)}`);
    const [d] = rows;
    assert(d.hash === env.hashB && d.spaceId === env.spaceId, `the difference is for ${d.spaceId}/${d.hash}, expected HASH_B`);
    assert(parseCount(d.intended) === 3 && parseCount(d.actual) === 1 && parseCount(d.delta) === 2,
      `the difference shows intended ${d.intended}, actual ${d.actual}, delta ${d.delta}; expected 3, 1, +2`);
    const toggle = page.locator(testid('diff-events-toggle')).first();
    await toggle.click();
    await page.locator(`${testid('diff-events')}:not([hidden])`).first().waitFor({ state: 'visible' });
    const eventRows = await page.locator(`${testid('diff-events')} ${testid('event-row')}`).count();
    assert(eventRows > 0, 'the difference lists no event that touched HASH_B');
    await screenshot('reconcile.png');
  });

  await step('reconcile: applying the selected repair verifies HASH_B at 3', async () => {
    const apply = page.locator(testid('apply-button'));
    assert(await apply.isDisabled(), 'Apply is enabled before any row is selected');
    await page.locator(`${testid('diff-row')}${attr('data-hash', env.hashB)} ${testid('diff-select')}`).check();
    assert(await apply.isEnabled(), 'Apply stays disabled after selecting a row');
    await confirmWith(apply);
    const row = page.locator(`${testid('applied-row')}${attr('data-hash', env.hashB)}${attr('data-space-id', env.spaceId)}`);
    await row.waitFor({ state: 'visible' });
    const refCount = parseCount(await row.locator(testid('applied-refcount')).textContent());
    assert(refCount === 3, `the verified result shows refCount ${refCount} for HASH_B, expected 3`);
    const match = await row.locator(testid('applied-match')).getAttribute('data-match');
    const mark = await row.locator(testid('applied-match')).textContent();
    assert(match === 'true' && mark.includes('✓'), `the verified result does not check HASH_B off (match=${match}, "${mark}")`);
    await screenshot('reconcile-applied.png');
  });

  await step('balances: filtering HASH_B now shows 3', async () => {
    await gotoTab('balances');
    const count = await balanceOf(env.hashB);
    assert(count === 3, `HASH_B's count is ${count}, expected 3`);
  });

  await step('suspend: Escape closes the dialog without suspending, and focus returns', async () => {
    await gotoTab('overview');
    await waitFor('the App to be active', () => textOf(testid('app-status')), (t) => t === 'Active');
    const suspend = page.locator(testid('suspend-button'));
    await suspend.click();
    const dialog = page.locator(testid('confirm-dialog'));
    await dialog.waitFor({ state: 'visible' });
    const inside = await page.evaluate(() => document.querySelector('[data-testid="confirm-dialog"]').contains(document.activeElement));
    assert(inside, 'focus is not inside the open dialog');
    for (let i = 0; i < 4; i += 1) await page.keyboard.press('Tab');
    const stillInside = await page.evaluate(() => document.querySelector('[data-testid="confirm-dialog"]').contains(document.activeElement));
    assert(stillInside, 'Tab moved focus out of the open dialog');
    await page.keyboard.press('Escape');
    await dialog.waitFor({ state: 'hidden' });
    assert(await textOf(testid('app-status')) === 'Active', 'Escape suspended the App');
    const focused = await page.evaluate(() => document.activeElement?.dataset.testid);
    assert(focused === 'suspend-button', `focus went to ${focused}, not back to the Suspend button`);
  });

  await step('suspend: confirming the dialog suspends the App', async () => {
    await confirmWith(page.locator(testid('suspend-button')));
    await waitFor('the App to show as suspended', () => textOf(testid('app-status')), (t) => t === 'Suspended');
  });

  await step('resume: confirming the dialog makes the App active again', async () => {
    await confirmWith(page.locator(testid('resume-button')));
    await waitFor('the App to show as active', () => textOf(testid('app-status')), (t) => t === 'Active');
  });

  await step('narrow screens: no sideways page scroll at 360px and 390px', async () => {
    await page.setViewportSize(SMALLEST);
    for (const tab of ['balances', 'reconcile']) {
      await page.goto(uiUrl(`#/apps/${encodeURIComponent(env.appId)}/${tab}`));
      await waitFor(`the ${tab} page`, () => page.locator(`${testid(`tab-${tab}`)}[aria-current="page"]`).count(), (n) => n === 1);
      await noHorizontalScroll(`${tab} at ${SMALLEST.width}px`);
    }
    await page.setViewportSize(NARROW);
    await page.goto(uiUrl('#/apps'));
    await waitFor(`the Apps table to list ${env.appId}`, () => appRow().count(), (n) => n === 1);
    await noHorizontalScroll(`apps at ${NARROW.width}px`);
    await screenshot('apps-narrow.png');
  });

  await step('sign out shows the sign-in page', async () => {
    await page.setViewportSize(DESKTOP);
    await page.locator(testid('logout-button')).click();
    await page.locator(testid('signin-page')).waitFor({ state: 'visible' });
    await page.reload();
    await page.locator(testid('signin-page')).waitFor({ state: 'visible' });
  });

  await browser.close();
  console.log(`admin-ui: all ${stepNumber} steps passed`);
}

const watchdog = setTimeout(() => fail(`the run took longer than ${TOTAL_TIMEOUT_MS / 1000} s`), TOTAL_TIMEOUT_MS);
watchdog.unref();

main().catch((err) => abort(err.stack || String(err)));
