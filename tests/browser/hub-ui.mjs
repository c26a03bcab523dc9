// Drives the UniCAS hub UI end to end in headless Chromium and exits non-zero on the first
// failed step, saying what failed. Prints `hub-ui: ok: <step>` for each step that passed.
//
// Environment (set by the Rust test that starts the hub with token auth and creates users):
//   HUB_BASE             the hub, e.g. http://127.0.0.1:PORT
//   OWNER_LOGIN_LINK     absolute one-time sign-in link of `ada`, a normal user
//   VIEWER_LOGIN_LINK    … of `vic` (made a viewer of the test's project by step 7)
//   OUTSIDER_LOGIN_LINK  … of `olga` (no member of anything)
//   OWNER_TOKEN          a personal access token of `ada`, for the script's own API calls
//   VIEWER_ID            the viewer's user id (`vic`)
//   SESSIONS             `1` when marimo sessions can start (else the editor step is skipped)
//   SCREENSHOT_DIR       where to save PNGs (optional: no screenshots when unset)
//   CHROMIUM             the browser (default /usr/bin/chromium)
//
// The helpers (steps, waiting, pages, sign-in, accessibility checks) are in hub-ui-lib.mjs.

import {
  abort, accessibilityProblems, assert, attr, browser, confirmWith, countOf, DESKTOP,
  EDITOR_TIMEOUT_MS, env, fail, launch, newPage, noHorizontalScroll, ownerApi, page, screenshot,
  signIn, skip, SMALLEST, step, StepError, stepNumber, testid, textOf, TOTAL_TIMEOUT_MS, url,
  visit, visited, waitFor
} from './hub-ui-lib.mjs';

const state = { pid: null, nid: null, projectName: null, notebookTitle: null, rev1: null, rev2: null, rev3: null };

const projectAddress = () => `/projects/${state.pid}`;
const notebookAddress = () => `/projects/${state.pid}/notebooks/${state.nid}`;

const versionRow = (revision) => page.locator(`${testid('version-row')}${attr('data-revision', revision)}`);
const versionRevisions = () => page.locator(testid('version-row')).evaluateAll((rows) => rows.map((r) => Number(r.dataset.revision)));

const NOTEBOOK_V1 = `import marimo

__generated_with = "0.13.0"
app = marimo.App()

@app.cell
def _():
    rate = 0.05
    rate
    return (rate,)

@app.cell
def _(rate):
    growth = (1 + rate) ** 10
    growth
    return (growth,)

@app.cell
def _():
    # Assumptions, unchanged between revisions: stored once however many revisions keep them.
    assumptions = [
${Array.from({ length: 120 }, (_, i) => `        ("year ${2000 + i}", "inflation ${(i % 7) + 1}.${i % 10}%", "demand index ${100 + i * 3}", "note: steady"),`).join('\n')}
    ]
    len(assumptions)
    return (assumptions,)

if __name__ == "__main__":
    app.run()
`;
// The second save changes one line.
const NOTEBOOK_V2 = NOTEBOOK_V1.replace('    rate = 0.05\n', '    rate = 0.07\n');

async function main() {
  await launch();
  const stamp = Date.now().toString(36);
  state.projectName = `Browser test ${stamp}`;
  state.notebookTitle = `Revenue model ${stamp}`;

  await step('1. the owner\'s login link signs in and lands on the projects page', async () => {
    await signIn(page, env.ownerLink, 'the owner');
    await waitFor('the signed-in user in the header', () => textOf(testid('account-name')), Boolean);
    assert(await page.locator(testid('logout-button')).isVisible(), 'there is no visible Sign out button');
    await page.locator(`${testid('projects-table')}, ${testid('projects-empty')}`).first().waitFor();
    visited.add('/');
    await screenshot('hub-projects.png');
  });

  await step('2. a project and a notebook are created through the forms', async () => {
    await page.locator(testid('new-project-name')).fill(state.projectName);
    await page.locator(testid('new-project-description')).fill('Made by the browser test.');
    await page.locator(testid('new-project-submit')).click();
    const projectPath = await waitFor('the new project\'s page', () => new URL(page.url()).pathname, (p) => /^\/projects\/proj-[a-z2-7]+$/.test(p));
    state.pid = projectPath.split('/')[2];
    await waitFor('the project title', () => textOf(testid('project-title')), (t) => t === state.projectName);
    await page.locator(testid('new-notebook-title')).fill(state.notebookTitle);
    await page.locator(testid('new-notebook-description')).fill('Ten years of growth.');
    await page.locator(testid('new-notebook-tags')).fill('finance, demo');
    await page.locator(testid('new-notebook-submit')).click();
    const notebookPath = await waitFor('the new notebook\'s page', () => new URL(page.url()).pathname,
      (p) => p.startsWith(`/projects/${state.pid}/notebooks/nb-`));
    state.nid = notebookPath.split('/')[4];
    await waitFor('the notebook title', () => textOf(testid('notebook-title')), (t) => t === state.notebookTitle);
    visited.add(projectAddress());
  });

  await step('3. two saves through the API show up as two revisions in the history', async () => {
    const nb = await ownerApi('GET', `/projects/${state.pid}/notebooks/${state.nid}`);
    const first = await ownerApi('POST', `/projects/${state.pid}/notebooks/${state.nid}/workspace`, {
      expected_revision: nb.head_revision ?? null,
      files: { 'notebook.py': { content: NOTEBOOK_V1 } },
      message: 'A rate of 5%',
    });
    const second = await ownerApi('POST', `/projects/${state.pid}/notebooks/${state.nid}/workspace`, {
      expected_revision: first.revision,
      files: { 'notebook.py': { content: NOTEBOOK_V2 } },
      message: 'A rate of 7%',
    });
    state.rev1 = first.revision;
    state.rev2 = second.revision;
    await visit(notebookAddress());
    const revisions = await waitFor('both revisions in the history', versionRevisions,
      (list) => list.includes(state.rev1) && list.includes(state.rev2));
    assert(revisions[0] === state.rev2, `the history is not newest first: ${JSON.stringify(revisions)}`);
    const kind = await versionRow(state.rev2).getAttribute('data-kind');
    assert(kind === 'save', `revision ${state.rev2} has kind ${kind}, expected save`);
    const message = await textOf(`${testid('version-row')}${attr('data-revision', state.rev2)} ${testid('version-message')}`);
    assert(message === 'A rate of 7%', `revision ${state.rev2} shows the message "${message}"`);
    const head = await textOf(testid('notebook-head'));
    assert(Number(head) === state.rev2, `the head revision shows "${head}", expected ${state.rev2}`);
    await page.locator(`${testid('file-row')}${attr('data-path', 'notebook.py')}`).waitFor();
    await screenshot('hub-notebook.png');
  });

  await step('4. the diff between the two revisions shows the changed line', async () => {
    await versionRow(state.rev1).locator(testid('compare-from')).check();
    await versionRow(state.rev2).locator(testid('compare-to')).check();
    await page.locator(testid('compare-button')).click();
    await waitFor('the diff address', () => new URL(page.url()), (u) => u.pathname.endsWith('/diff')
      && u.searchParams.get('from') === String(state.rev1) && u.searchParams.get('to') === String(state.rev2));
    const file = page.locator(`${testid('diff-file')}${attr('data-path', 'notebook.py')}`);
    await file.waitFor();
    const dels = await waitFor('a removed line', () => file.locator(testid('diff-del')).allTextContents(), (l) => l.length > 0);
    const adds = await file.locator(testid('diff-add')).allTextContents();
    assert(dels.length === 1 && dels[0].includes('rate = 0.05'), `removed lines: ${JSON.stringify(dels)}`);
    assert(adds.length === 1 && adds[0].includes('rate = 0.07'), `added lines: ${JSON.stringify(adds)}`);
    const delClass = await file.locator(testid('diff-del')).first().getAttribute('class');
    assert(/\bdel\b/.test(delClass ?? ''), `a removed line has class "${delClass}", not del`);
    visited.add(new URL(page.url()).pathname + new URL(page.url()).search);
    await screenshot('hub-diff.png');
    await page.locator(testid('diff-mode-split')).check();
    await page.locator(`${testid('diff-table')}.split`).first().waitFor();
    const splitDel = await file.locator(testid('diff-del')).allTextContents();
    const splitAdd = await file.locator(testid('diff-add')).allTextContents();
    assert(splitDel.some((t) => t.includes('rate = 0.05')) && splitAdd.some((t) => t.includes('rate = 0.07')),
      `side by side: removed ${JSON.stringify(splitDel)}, added ${JSON.stringify(splitAdd)}`);
    assert(new URL(page.url()).searchParams.get('view') === 'split', 'the side-by-side layout is not in the address');
    await screenshot('hub-diff-split.png');
  });

  await step('5. the older revision\'s file opens, and restoring it makes a new head revision', async () => {
    await visit(notebookAddress());
    await versionRow(state.rev1).locator(testid('version-files')).click();
    await waitFor('the files of the older revision', () => new URL(page.url()), (u) => u.pathname.endsWith('/files')
      && u.searchParams.get('rev') === String(state.rev1));
    await page.locator(`${testid('file-link')}${attr('data-path', 'notebook.py')}`).click();
    const content = await waitFor('the file\'s text', () => textOf(testid('file-content')), (t) => t?.includes('rate = 0.05'));
    assert(!content.includes('rate = 0.07'), 'the older revision shows the newer text');
    const address = new URL(page.url());
    assert(address.pathname === `${notebookAddress()}/files/notebook.py` && address.searchParams.get('rev') === String(state.rev1),
      `the file page is at ${address.pathname}${address.search}`);
    const numbered = await page.locator(`${testid('file-content')} .line`).count();
    assert(numbered === NOTEBOOK_V1.trimEnd().split('\n').length, `${numbered} numbered lines, expected ${NOTEBOOK_V1.trimEnd().split('\n').length}`);
    visited.add(address.pathname + address.search);
    await visit(notebookAddress());
    const restore = versionRow(state.rev1).locator(testid('version-restore'));
    await restore.click();
    const revisions = await waitFor('a new head revision at the top of the history', versionRevisions, (l) => l[0] > state.rev2);
    state.rev3 = revisions[0];
    const top = versionRow(state.rev3);
    assert(await top.getAttribute('data-kind') === 'restore', `the new head has kind ${await top.getAttribute('data-kind')}, expected restore`);
    assert(await top.getAttribute('data-head') === 'true', 'the new revision is not marked as the head');
  });

  await step('6. the notebook goes to the trash and comes back', async () => {
    await confirmWith(page.locator(testid('delete-notebook')));
    await waitFor('the project page after the delete', () => new URL(page.url()).pathname, (p) => p === projectAddress());
    await page.locator(testid('tab-trash')).click();
    await waitFor('the trash page', () => new URL(page.url()).pathname, (p) => p === `${projectAddress()}/trash`);
    const row = page.locator(`${testid('trash-row')}${attr('data-title', state.notebookTitle)}`);
    await row.waitFor();
    visited.add(`${projectAddress()}/trash`);
    await screenshot('hub-trash.png');
    await row.locator(testid('trash-restore')).click();
    await waitFor('the notebook to leave the trash', () => row.count(), (n) => n === 0);
    await page.locator(testid('tab-notebooks')).click();
    const back = page.locator(`${testid('notebook-row')}${attr('data-title', state.notebookTitle)}`);
    await back.waitFor();
    state.nid = await back.getAttribute('data-notebook-id');
  });

  await step('7. the viewer is added as a member with role viewer on the Settings page', async () => {
    await page.locator(testid('tab-settings')).click();
    await waitFor('the settings page', () => new URL(page.url()).pathname, (p) => p === `${projectAddress()}/settings`);
    await page.locator(testid('add-member-id')).fill(env.viewerId);
    await page.locator(testid('add-member-role')).selectOption('viewer');
    await page.locator(testid('add-member-submit')).click();
    const row = page.locator(`${testid('member-row')}${attr('data-user-id', env.viewerId)}`);
    await row.waitFor();
    assert(await row.getAttribute('data-role') === 'viewer', `the member row has role ${await row.getAttribute('data-role')}`);
    const project = await ownerApi('GET', `/projects/${state.pid}`);
    const member = project.members.find((m) => m.user_id === env.viewerId);
    assert(member?.role === 'viewer', `the API lists the viewer as ${JSON.stringify(member)}`);
    visited.add(`${projectAddress()}/settings`);
    await screenshot('hub-settings.png');
  });

  await step('8. the storage page shows the API\'s dedup ratio', async () => {
    await page.locator(testid('tab-storage')).click();
    await waitFor('the storage page', () => new URL(page.url()).pathname, (p) => p === `${projectAddress()}/storage`);
    // The ratio can move (the CAS packs nodes in the background): compare one read with a
    // render made after it, a few times.
    let shown;
    let expected;
    await waitFor('the dedup ratio to match GET …/storage', async () => {
      const storage = await ownerApi('GET', `/projects/${state.pid}/storage`);
      expected = `${storage.dedupRatio.toFixed(2)}×`;
      await visit(`${projectAddress()}/storage`);
      shown = await waitFor('the dedup ratio', () => textOf(testid('dedup-ratio')), Boolean);
      return shown === expected;
    }, Boolean, 30_000).catch(() => {
      throw new StepError(`the page shows the dedup ratio "${shown}", the API answers "${expected}"`);
    });
    const chart = (await countOf(testid('storage-chart'))) + (await countOf(testid('storage-chart-empty')));
    assert(chart === 1, 'the storage page shows neither a chart nor a note about its absence');
    await screenshot('hub-storage.png');
  });

  if (env.sessions) {
    await step('9. an edit session opens marimo in the page, and closes', async () => {
      await visit(notebookAddress());
      await page.locator(testid('open-editor')).click();
      await waitFor('the editor page', () => new URL(page.url()).pathname, (p) => p === `${notebookAddress()}/edit`);
      const frameEl = page.locator(testid('editor-frame'));
      await frameEl.waitFor({ timeout: EDITOR_TIMEOUT_MS }).catch(async () => {
        throw new StepError(`no editor frame; the session status says "${await textOf(testid('session-status'))}"`);
      });
      assert(await frameEl.getAttribute('title'), 'the editor frame has no title');
      const frame = await waitFor('the editor frame to load a session page', async () => {
        const handle = await frameEl.elementHandle();
        return handle?.contentFrame();
      }, (f) => f && /\/s\/sess-[a-z2-7]+\//.test(f.url()), EDITOR_TIMEOUT_MS);
      // marimo's app renders into #root; the notebook's cells (CodeMirror editors) appear once
      // its kernel connection through the hub's proxy is up.
      await waitFor('marimo to render the notebook\'s cells in the frame', () => frame.evaluate(() => {
        const root = document.querySelector('#root');
        const text = document.body?.innerText ?? '';
        return {
          rendered: Boolean(root && root.childElementCount > 0),
          cells: document.querySelectorAll('.cm-editor, [data-cell-id]').length,
          error: /session_ended|UNAUTHORIZED|no such session|"success":\s*false/.test(text),
        };
      }), (r) => r.rendered && r.cells > 0 && !r.error, EDITOR_TIMEOUT_MS);
      assert(new URL(frame.url()).pathname.startsWith('/s/'), `the frame is at ${frame.url()}`);
      if (env.sessionOrigin) {
        assert(new URL(frame.url()).origin === env.sessionOrigin,
          `the editor is on ${new URL(frame.url()).origin}, not on the sessions' own origin ${env.sessionOrigin}`);
      }
      const status = await page.locator(testid('session-status')).getAttribute('data-state');
      assert(status === 'running', `the session status is ${status}`);
      await page.waitForTimeout(1500);
      await screenshot('hub-editor.png');
      await page.locator(testid('close-session')).click();
      // Closing saves the session's changes and renders the notebook: it can take a while.
      await waitFor('the notebook page after closing the session', () => new URL(page.url()).pathname,
        (p) => p === notebookAddress(), EDITOR_TIMEOUT_MS);
    });
  } else {
    skip('9. an edit session opens marimo in the page, and closes', 'SESSIONS is not 1');
  }

  await step('10. an access token is created, shown once, and revoked', async () => {
    await page.locator(testid('nav-tokens')).click();
    await waitFor('the tokens page', () => new URL(page.url()).pathname, (p) => p === '/tokens');
    await waitFor('the tokens list', async () => (await countOf(testid('tokens-table'))) + (await countOf(testid('tokens-empty'))), (n) => n === 1);
    const name = `browser test ${Date.now().toString(36)}`;
    await page.locator(testid('token-name')).fill(name);
    await page.locator(testid('token-expiry')).fill('7');
    await page.locator(testid('token-submit')).click();
    const secret = await waitFor('the new token', () => textOf(testid('new-token')), (t) => t?.startsWith('uhub_pat_'));
    const row = page.locator(`${testid('token-row')}${attr('data-name', name)}`);
    await row.waitFor();
    visited.add('/tokens');
    await screenshot('hub-tokens.png');
    // Shown once: a reload lists the token but not its secret.
    await visit('/tokens');
    await row.waitFor();
    assert(!(await page.locator('main').textContent()).includes(secret), 'the token is shown again after a reload');
    await confirmWith(row.locator(testid('token-revoke')));
    await waitFor('the revoked token to leave the list', () => row.count(), (n) => n === 0);
  });

  await step('11. the viewer sees files and history but no change controls', async () => {
    const viewerContext = await browser.newContext({ viewport: DESKTOP });
    const viewer = await newPage(viewerContext);
    await signIn(viewer, env.viewerLink, 'the viewer');
    await visit(notebookAddress(), { target: viewer, heading: new RegExp(`^${state.notebookTitle}$`) });
    await waitFor('the history', () => countOf(testid('version-row'), viewer), (n) => n >= 3);
    await waitFor('the files', () => countOf(testid('file-row'), viewer), (n) => n >= 1);
    for (const id of ['open-editor', 'delete-notebook', 'version-restore', 'fork-submit', 'fork-form', 'rotate-sync-token', 'details-form']) {
      assert(await countOf(testid(id), viewer) === 0, `the viewer sees ${id}`);
    }
    assert(await countOf(testid('version-files'), viewer) > 0, 'the viewer cannot open a revision\'s files');
    await visit(projectAddress(), { target: viewer });
    await waitFor('the viewer\'s notebook list', () => countOf(testid('notebook-row'), viewer), (n) => n >= 1);
    assert(await countOf(testid('new-notebook-form'), viewer) === 0, 'the viewer sees the New notebook form');
    assert(await countOf(testid('tab-settings'), viewer) === 0, 'the viewer sees the Settings tab');
    await viewerContext.close();
  });

  await step('12. an outsider sees the Not found page for the project', async () => {
    const outsiderContext = await browser.newContext({ viewport: DESKTOP });
    const outsider = await newPage(outsiderContext);
    await signIn(outsider, env.outsiderLink, 'the outsider');
    for (const address of [projectAddress(), notebookAddress()]) {
      await outsider.goto(url(address));
      await outsider.locator(testid('not-found')).waitFor();
      const heading = await textOf('main h1', outsider);
      assert(heading === 'Not found', `${address} shows the heading "${heading}"`);
      const body = await outsider.locator('main').textContent();
      assert(!body.includes(state.projectName), `${address} shows the project's name to an outsider`);
    }
    await outsiderContext.close();
  });

  await step('13. at 360px wide the projects and notebook pages do not scroll sideways', async () => {
    // The projects page again, now that it lists the test's project.
    await visit('/');
    await page.locator(`${testid('project-row')}${attr('data-project-id', state.pid)}`).waitFor();
    await screenshot('hub-projects.png');
    await page.setViewportSize(SMALLEST);
    await visit('/');
    await page.locator(`${testid('project-row')}${attr('data-project-id', state.pid)}`).waitFor();
    await noHorizontalScroll('projects at 360px');
    await visit(notebookAddress());
    await page.locator(testid('version-row')).first().waitFor();
    await noHorizontalScroll('notebook at 360px');
    await screenshot('hub-notebook-narrow.png');
    await page.setViewportSize(DESKTOP);
  });

  await step('14. every visited page passes the basic accessibility checks', async () => {
    const problems = [];
    for (const address of visited) {
      await visit(address);
      // Wait for what loads after the heading (tables, forms) before checking. (Not with
      // waitForFunction: it evaluates a string, which the hub's CSP refuses.)
      await waitFor(`${address} to finish loading`, () => page.evaluate(() => !document.querySelector('#main[aria-busy="true"], main .loading')));
      for (const p of await accessibilityProblems()) problems.push(`${address}: ${p}`);
    }
    // The sign-in and Not found pages, in a fresh context.
    const fresh = await browser.newContext({ viewport: DESKTOP });
    const anonymous = await newPage(fresh);
    await anonymous.goto(url('/login?error=link_invalid'));
    await anonymous.locator(testid('login-page')).waitFor();
    assert(await countOf(testid('login-error'), anonymous) === 1, 'the sign-in page does not explain error=link_invalid');
    for (const p of await accessibilityProblems(anonymous)) problems.push(`/login: ${p}`);
    await anonymous.goto(url(notebookAddress()));
    await waitFor('an anonymous visit to go to the sign-in page with its next', () => new URL(anonymous.url()),
      (u) => u.pathname === '/login' && u.searchParams.get('next') === notebookAddress());
    await fresh.close();
    await visit('/projects/proj-aaaaaaaaaaaaaaaa/nothing-here');
    await page.locator(testid('not-found')).waitFor();
    for (const p of await accessibilityProblems()) problems.push(`not found page: ${p}`);
    assert(problems.length === 0, `accessibility problems:\n  ${problems.join('\n  ')}`);
  });

  await browser.close();
  console.log(`hub-ui: all ${stepNumber} steps done`);
}

const watchdog = setTimeout(() => fail(`the run took longer than ${TOTAL_TIMEOUT_MS / 1000} s`), TOTAL_TIMEOUT_MS);
watchdog.unref();

main().catch((err) => abort(err.stack || String(err)));
