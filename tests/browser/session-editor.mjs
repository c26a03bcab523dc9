// Opens a hub session's marimo editor in headless Chromium through the hub's proxy, with the
// session's open link (a ticket the proxy exchanges for a cookie), runs the notebook and waits
// until the cell's output is rendered. Exits non-zero, saying what failed, otherwise.
//
// Environment (set by tests/tests/session_ui.rs):
//   OPEN_URL    the session's absolute open link
//   EXPECT      text the rendered output must show
//   SCREENSHOT  where to save a PNG of the editor (optional)
//   CHROMIUM    the browser (default /usr/bin/chromium)

import { chromium } from 'playwright-core';

const TIMEOUT_MS = 45_000;

function fail(message) {
  console.error(`session-editor: FAILED: ${message}`);
  process.exit(1);
}

const openUrl = process.env.OPEN_URL || fail('OPEN_URL is not set');
const expect = process.env.EXPECT || fail('EXPECT is not set');
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox'],
});
const errors = [];
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  page.on('console', (m) => m.type() === 'error' && errors.push(`console: ${m.text()}`));
  page.on('requestfailed', (r) => errors.push(`failed: ${r.method()} ${r.url()} ${r.failure()?.errorText}`));
  page.on('response', (r) => r.status() >= 400 && errors.push(`${r.status()}: ${r.request().method()} ${r.url()}`));
  page.on('websocket', (ws) => {
    ws.on('close', () => errors.push(`websocket closed: ${ws.url()}`));
    ws.on('socketerror', (e) => errors.push(`websocket error: ${e}`));
  });
  const response = await page.goto(openUrl, { timeout: TIMEOUT_MS });
  if (!response || !response.ok()) fail(`the open link answered ${response?.status()}`);
  const landed = new URL(page.url());
  if (landed.searchParams.has('ticket')) fail(`the ticket stayed in the URL: ${page.url()}`);
  if (!/^\/s\/sess-[a-z2-7]{16}\/$/.test(landed.pathname)) fail(`landed on ${page.url()}`);
  // Run the notebook (marimo does not run cells on open by default): the kernel runs the cell
  // and its output comes back over the proxied WebSocket.
  const run = page.locator('[data-testid="run-button"]:not([disabled])').first();
  await run
    .waitFor({ state: 'visible', timeout: TIMEOUT_MS })
    .catch(() => fail(`no run button; ${errors.join(' | ')}`));
  // The button answers once the kernel is connected; click until the run request goes out.
  const deadline = Date.now() + TIMEOUT_MS;
  for (;;) {
    const sent = page.waitForRequest(/\/api\/kernel\/run/, { timeout: 3000 }).then(() => true, () => false);
    await run.click();
    if (await sent) break;
    if (Date.now() > deadline) fail(`the run button never ran the notebook; ${errors.join(' | ')}`);
  }
  await page
    .getByText(expect, { exact: true })
    .first()
    .waitFor({ state: 'visible', timeout: TIMEOUT_MS })
    .catch(async () => {
      const text = (await page.locator('body').innerText().catch(() => '')).slice(0, 600);
      if (process.env.SCREENSHOT) await page.screenshot({ path: `${process.env.SCREENSHOT}.failed.png` });
      fail(`no rendered output ${JSON.stringify(expect)}; the page shows: ${JSON.stringify(text)}; ${errors.join(' | ')}`);
    });
  if (process.env.SCREENSHOT) {
    await page.waitForTimeout(500);
    await page.screenshot({ path: process.env.SCREENSHOT });
  }
  console.log('ok - the session editor rendered the cell output through the proxy');
} finally {
  await browser.close();
}
