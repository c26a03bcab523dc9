// UniCAS admin UI: a hash-routed single-page app over the admin HTTP API (/admin/*).
//
// Plain ES module with no build step: the server embeds this file as it is. Every view renders
// from location.hash, so a page can be linked, reloaded and reached with Back. Data is always
// read through the API's cursors, never all at once: an App can hold 100,000 balances. What it
// shares with the hub's web UI (element builders, formatting, alerts, the confirmation dialog,
// the request helpers; web-common/common.js) the server serves beside it as ./common.js.

import {
  ApiError, bytes, createPage, dataTable, errorText, field, fill, formatBytes, formatCount, h, hiddenTh, loading,
  numTh, pageElements, parseJson, plural, request, setParams, timeElement, uid,
} from './common.js';

const HASH_RE = /^[0-9a-f]{64}$/;
const DOMAIN_RE = /^[a-z][a-z0-9]*(?::[a-z0-9]+)*$/;
const PAGE_SIZES = [25, 50, 100, 200];
const DEFAULT_PAGE_SIZE = 50;
// Differences of one comparison arrive in one response; only this many are in the DOM at once.
const DIFF_PAGE_SIZE = 100;
// Spaces listed on the overview before a "Show all" button.
const SPACES_SHOWN = 50;
const KEY_ALGORITHMS = ['EdDSA', 'ES256', 'RS256'];
const APP_TABS = [
  ['', 'Overview'],
  ['balances', 'Balances'],
  ['events', 'Events'],
  ['reconcile', 'Reconcile'],
  ['keys', 'Keys'],
  ['members', 'Members'],
];

/** The signed-in session: { account, csrfToken }, or null on the sign-in page. */
let session = null;

const els = pageElements();
const {
  mount, setTitle, showError, clearAlert, toast, announce, confirmDialog, bindSkeleton, handleSubmit, copyText, runView,
} = createPage(els, {
  product: 'UniCAS admin',
  // Any 401: the session is missing or has expired.
  intercept: (err) => {
    if (!(err instanceof ApiError && err.status === 401)) return false;
    renderSignIn();
    return true;
  },
});
const enc = encodeURIComponent;

/* ------------------------------------------------------------------------------------------ */
/* Formatting                                                                                  */
/* ------------------------------------------------------------------------------------------ */

const deltaFormat = new Intl.NumberFormat(undefined, { signDisplay: 'exceptZero' });
const formatDelta = (n) => (typeof n === 'number' ? deltaFormat.format(n) : '—');

/** A timestamp in ms since the epoch, as a local date-time (to the second). */
function time(ms) {
  if (typeof ms !== 'number') return h('span', {}, '—');
  const date = new Date(ms);
  return timeElement(date, date.toISOString(), { seconds: true });
}

const shortHash = (hash) => (HASH_RE.test(hash) ? `${hash.slice(0, 10)}…${hash.slice(-6)}` : String(hash));
const asText = (v) => (v == null ? '—' : typeof v === 'object' ? JSON.stringify(v) : String(v));

/** A hash: abbreviated, the full value in the tooltip, and (optionally) a copy button. */
function hashView(hash, { copy = true } = {}) {
  const code = h('code', { class: 'hash', title: hash, data: { hash } }, shortHash(hash));
  if (!copy) return code;
  return h('span', { class: 'hash-cell' }, code,
    h('button', {
      type: 'button',
      class: 'icon-button',
      testid: 'copy-hash',
      title: 'Copy the full hash',
      'aria-label': `Copy hash ${shortHash(hash)}`,
      onclick: () => copyText(hash, 'Hash copied to the clipboard.'),
    }, 'Copy'));
}

/* ------------------------------------------------------------------------------------------ */
/* API                                                                                         */
/* ------------------------------------------------------------------------------------------ */

/**
 * Calls the admin API. `query` entries that are empty are left out; `json` is sent as JSON,
 * or `body` with `contentType`. State-changing methods carry the session's CSRF token.
 * Resolves the parsed JSON (null for 204); rejects with ApiError carrying the API's message.
 */
async function api(method, path, { query, json, body, contentType } = {}) {
  const response = await request(new URL(`/admin${path}`, window.location.origin), method, {
    query, json, body, contentType, csrfToken: session?.csrfToken, unreachable: 'The server could not be reached',
  });
  if (response.status === 204) return null;
  const text = await response.text();
  // The admin API's errors are { error: CODE, message }.
  const data = parseJson(text);
  if (!response.ok) {
    throw new ApiError(response.status, data?.error ?? `HTTP_${response.status}`, data?.message ?? errorText(text, response.statusText));
  }
  return data;
}

const appPath = (appId, rest = '') => `/apps/${enc(appId)}${rest}`;

/* ------------------------------------------------------------------------------------------ */
/* Routing                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/** `#/apps/{appId}/{tab}?query`, with query values left out when empty. */
function appHref(appId, tab = '', params = {}) {
  const qs = setParams(new URLSearchParams(), params).toString();
  return `#/apps/${enc(appId)}${tab ? `/${tab}` : ''}${qs ? `?${qs}` : ''}`;
}

function parseRoute() {
  const raw = window.location.hash.replace(/^#/, '');
  const q = raw.indexOf('?');
  const path = q < 0 ? raw : raw.slice(0, q);
  const params = new URLSearchParams(q < 0 ? '' : raw.slice(q + 1));
  let segments;
  try {
    segments = path.split('/').filter(Boolean).map(decodeURIComponent);
  } catch {
    segments = ['invalid'];
  }
  return { segments, params };
}

const TAB_VIEWS = {
  '': overviewView,
  balances: balancesView,
  events: eventsView,
  reconcile: reconcileView,
  keys: keysView,
  members: membersView,
};

function resolveView({ segments }) {
  if (segments.length === 0 || (segments.length === 1 && segments[0] === 'apps')) return appsView;
  if (segments[0] === 'apps' && (segments.length === 2 || segments.length === 3)) {
    return TAB_VIEWS[segments[2] ?? ''] ?? notFoundView;
  }
  return notFoundView;
}

let routeSeq = 0;

/**
 * Renders the view of the current hash. Views mount their headings synchronously and then
 * load; `ctx.stale()` tells a view that the user has moved on, so late answers are dropped.
 */
async function route({ initial = false } = {}) {
  if (!session) {
    renderSignIn();
    return;
  }
  const seq = ++routeSeq;
  const { segments, params } = parseRoute();
  const ctx = { segments, params, appId: segments[1], stale: () => seq !== routeSeq };
  await runView(resolveView(ctx), ctx, { initial });
}

/* ------------------------------------------------------------------------------------------ */
/* Session and sign-in                                                                         */
/* ------------------------------------------------------------------------------------------ */

function renderAccount() {
  const { account } = session;
  fill(els.accountName, account.displayName || account.email || account.id,
    account.platformAdmin ? [' ', h('span', { class: 'badge' }, 'Platform admin')] : null);
  els.accountName.title = account.email ?? '';
  els.account.hidden = false;
  els.siteNav.hidden = false;
}

async function renderSignIn() {
  session = null;
  routeSeq += 1;
  els.account.hidden = true;
  els.siteNav.hidden = true;
  els.main.removeAttribute('aria-busy');
  setTitle('Sign in');
  const list = h('ul', { class: 'providers', testid: 'provider-list' }, h('li', {}, loading('Loading sign-in providers…')));
  mount(h('section', { class: 'signin card', testid: 'signin-page' },
    h('h1', { tabindex: -1 }, 'Sign in'),
    h('p', {}, 'Sign in to administer UniCAS Apps.'),
    list,
    h('p', { class: 'hint' },
      'The local operator signs in with the one-time link printed by ',
      h('code', {}, 'unicas-server admin login-link'), '.')));
  try {
    const { items } = await api('GET', '/providers');
    fill(list, ...(items.length
      ? items.map((p) => h('li', {},
        // A full-page navigation: the provider's sign-in page is not ours to fetch.
        h('a', { class: 'button', href: `/admin/login/${enc(p.name)}`, testid: 'provider-link', data: { provider: p.name } },
          `Sign in with ${p.displayName || p.name}`)))
      : [h('li', {}, 'No sign-in provider is configured.')]));
  } catch (err) {
    fill(list, h('li', {}, `The sign-in providers could not be loaded: ${err.message}`));
  }
}

async function logout() {
  try {
    await api('POST', '/logout');
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) {
      showError(err);
      return;
    }
  }
  clearAlert();
  renderSignIn();
}

/* ------------------------------------------------------------------------------------------ */
/* Apps                                                                                        */
/* ------------------------------------------------------------------------------------------ */

async function appsView(ctx) {
  setTitle('Apps');
  const body = h('div', {}, loading('Loading Apps…'));
  mount(
    h('h1', { tabindex: -1 }, 'Apps'),
    body,
    session.account.platformAdmin ? createAppForm() : null,
  );
  const { items } = await api('GET', '/apps');
  if (ctx.stale()) return;
  fill(body, items.length ? appsTable(items) : h('p', { testid: 'apps-empty' }, 'No Apps yet.'));
}

function appsTable(apps) {
  return dataTable({
    testid: 'apps-table',
    caption: 'Apps and their usage',
    head: ['App', 'Status', numTh('Nodes'), numTh('Ready content'), numTh('Stored'),
      numTh('Reserved'), numTh('Revision'), 'Issuer', 'Created'],
    rows: apps.map((app) => h('tr', { testid: 'app-row', data: { appId: app.appId } },
      h('th', { scope: 'row' }, h('a', { href: appHref(app.appId), testid: 'app-link', data: { appId: app.appId } }, app.appId)),
      h('td', {}, statusBadge(app.suspended)),
      h('td', { class: 'num', testid: 'app-usage-nodes' }, formatCount(app.usage?.nodeCount)),
      h('td', { class: 'num' }, bytes(app.usage?.readyContentBytes, 'app-usage-content')),
      h('td', { class: 'num' }, bytes(app.usage?.readyStoredBytes, 'app-usage-stored')),
      h('td', { class: 'num' }, bytes(app.usage?.reservedBytes)),
      h('td', { class: 'num' }, formatCount(app.revision)),
      h('td', { class: 'wrap' }, app.issuer),
      h('td', {}, time(app.createdAt)))),
  });
}

function statusBadge(suspended, testid) {
  return h('span', { class: `badge ${suspended ? 'badge-warn' : 'badge-ok'}`, testid, data: { suspended: String(suspended) } },
    suspended ? 'Suspended' : 'Active');
}

function createAppForm() {
  const appId = h('input', { name: 'appId', required: true, autocomplete: 'off', spellcheck: 'false', testid: 'new-app-id' });
  const issuer = h('input', { name: 'issuer', required: true, autocomplete: 'off', spellcheck: 'false', testid: 'new-app-issuer' });
  const form = h('form', { class: 'card', testid: 'create-app-form' },
    h('h2', {}, 'Create an App'),
    h('div', { class: 'form-row' },
      field('App ID', appId),
      field('Issuer', issuer, 'The iss of the capabilities this App signs, e.g. https://app.example.')),
    h('div', { class: 'actions' }, h('button', { type: 'submit', testid: 'new-app-submit' }, 'Create App')));
  handleSubmit(form, async () => {
    const { app } = await api('POST', '/apps', { json: { appId: appId.value.trim(), issuer: issuer.value.trim() } });
    toast(`App ${app.appId} created.`);
    window.location.hash = appHref(app.appId);
  });
  return form;
}

/* ------------------------------------------------------------------------------------------ */
/* App pages: shared header                                                                    */
/* ------------------------------------------------------------------------------------------ */

function appHeader(appId, currentTab) {
  return [
    h('nav', { class: 'breadcrumbs', 'aria-label': 'Breadcrumb' },
      h('a', { href: '#/apps' }, 'Apps'), h('span', { 'aria-hidden': 'true' }, ' › '), h('span', { 'aria-current': 'page' }, appId)),
    h('h1', { tabindex: -1, testid: 'app-title', class: 'app-title' }, appId),
    h('nav', { class: 'tabs', 'aria-label': 'App sections' },
      h('ul', {}, APP_TABS.map(([tab, label]) => h('li', {},
        h('a', {
          href: appHref(appId, tab),
          testid: `tab-${tab || 'overview'}`,
          'aria-current': tab === currentTab ? 'page' : null,
        }, label))))),
  ];
}

/* ------------------------------------------------------------------------------------------ */
/* Overview: status, usage, Spaces, GC                                                         */
/* ------------------------------------------------------------------------------------------ */

async function overviewView(ctx) {
  const { appId } = ctx;
  setTitle(appId);
  const body = h('div', { class: 'stack' }, loading());
  mount(...appHeader(appId, ''), body);
  const detail = await api('GET', appPath(appId));
  if (ctx.stale()) return;
  const gc = gcForm(appId, detail.spaces);
  fill(body,
    statusSection(detail.app),
    usageSection(detail.app.usage),
    spacesSection(appId, detail.spaces, gc.prefill),
    gc.element);
}

function statusSection(initialApp) {
  let app = initialApp;
  const section = h('section', { class: 'card', 'aria-labelledby': 'status-heading' });
  const draw = (focusAction) => {
    const action = app.suspended
      ? h('button', { type: 'button', testid: 'resume-button', onclick: () => toggle() }, 'Resume App')
      : h('button', { type: 'button', class: 'danger', testid: 'suspend-button', onclick: () => toggle() }, 'Suspend App');
    fill(section,
      h('h2', { id: 'status-heading' }, 'Status'),
      h('div', { class: 'status-line' }, statusBadge(app.suspended, 'app-status'), action),
      h('p', { class: 'hint' }, app.suspended
        ? 'Suspended: the service refuses this App\'s capabilities. Stored content and balances are kept.'
        : 'Active: clients holding this App\'s capabilities are served.'),
      h('dl', { class: 'facts' },
        h('dt', {}, 'Issuer'), h('dd', { class: 'wrap' }, app.issuer),
        h('dt', {}, 'Created'), h('dd', {}, time(app.createdAt)),
        h('dt', {}, 'Revision'), h('dd', { testid: 'app-revision' }, formatCount(app.revision))));
    if (focusAction) action.focus();
  };
  const toggle = async () => {
    const suspending = !app.suspended;
    const confirmed = await confirmDialog(suspending
      ? {
        title: `Suspend ${app.appId}?`,
        message: 'Every request with this App\'s capabilities will be refused until it is resumed. Nothing is deleted.',
        confirmLabel: 'Suspend App',
        danger: true,
      }
      : {
        title: `Resume ${app.appId}?`,
        message: 'Requests with this App\'s capabilities will be served again.',
        confirmLabel: 'Resume App',
      });
    if (!confirmed) return;
    clearAlert();
    try {
      ({ app } = await api('POST', appPath(app.appId, suspending ? '/suspend' : '/resume')));
      draw(true);
      toast(app.suspended ? `${app.appId} is suspended.` : `${app.appId} is active again.`);
    } catch (err) {
      showError(err);
    }
  };
  draw(false);
  return section;
}

function usageSection(usage = {}) {
  const item = (label, value, testid) => h('div', { class: 'stat' }, h('dt', {}, label), h('dd', { testid }, value));
  return h('section', { class: 'card', 'aria-labelledby': 'usage-heading', testid: 'usage' },
    h('h2', { id: 'usage-heading' }, 'Usage'),
    h('dl', { class: 'stats' },
      item('Nodes', formatCount(usage.nodeCount), 'usage-nodes'),
      item('Ready content', bytes(usage.readyContentBytes), 'usage-content-bytes'),
      item('Stored', bytes(usage.readyStoredBytes), 'usage-stored-bytes'),
      item('Reserved for uploads', bytes(usage.reservedBytes), 'usage-reserved-bytes'),
      item('Not-ready nodes', formatCount(usage.notReadyNodeCount), 'usage-not-ready'),
      item('Leased nodes', formatCount(usage.leasedNodeCount), 'usage-leased')));
}

function spacesSection(appId, spaces, onGc) {
  const list = h('ul', { class: 'spaces', testid: 'spaces-list' });
  const more = h('div');
  const drawList = (all) => {
    const shown = all ? spaces : spaces.slice(0, SPACES_SHOWN);
    fill(list, ...shown.map((spaceId) => h('li', { testid: 'space-item', data: { spaceId } },
      h('code', { class: 'space-id' }, spaceId),
      h('span', { class: 'space-links' },
        h('a', { href: appHref(appId, 'balances', { spaceId }), 'aria-label': `Balances of ${spaceId}` }, 'Balances'),
        h('a', { href: appHref(appId, 'events', { spaceId }), 'aria-label': `Events of ${spaceId}` }, 'Events'),
        h('button', { type: 'button', class: 'secondary small', 'aria-label': `GC ${spaceId}…`, onclick: () => onGc(spaceId) }, 'GC…')))));
    fill(more, !all && spaces.length > SPACES_SHOWN
      ? h('button', {
        type: 'button',
        class: 'secondary',
        onclick: () => { drawList(true); list.querySelector(`li:nth-child(${SPACES_SHOWN + 1}) a`)?.focus(); },
      }, `Show all ${formatCount(spaces.length)} Spaces`)
      : null);
  };
  drawList(false);
  return h('section', { class: 'card', 'aria-labelledby': 'spaces-heading' },
    h('h2', { id: 'spaces-heading' }, 'Spaces'),
    h('p', { class: 'hint' }, spaces.length
      ? `${plural(spaces.length, 'Space')} seen in this App's balances.`
      : 'No Space has a balance yet.'),
    list, more);
}

function gcForm(appId, spaces) {
  const listId = uid('spaces');
  const space = h('input', { name: 'spaceId', required: true, list: listId, autocomplete: 'off', spellcheck: 'false', testid: 'gc-space' });
  const maxNodes = h('input', { name: 'maxNodes', type: 'number', min: 1, max: 10000, step: 1, inputmode: 'numeric', testid: 'gc-max-nodes' });
  const result = h('div', { 'aria-live': 'polite' });
  const form = h('form', { class: 'card', testid: 'gc-form', 'aria-labelledby': 'gc-heading' },
    h('h2', { id: 'gc-heading' }, 'Garbage collection'),
    h('p', { class: 'hint' }, 'One bounded pass over a Space: frees nodes that no root ref or node references and no lease protects.'),
    h('datalist', { id: listId }, spaces.map((s) => h('option', { value: s }))),
    h('div', { class: 'form-row' },
      field('Space', space),
      field('Max nodes (optional)', maxNodes, 'Examine at most this many nodes (1–10000); empty: the server\'s default.')),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'danger', testid: 'gc-submit' }, 'Run GC…')),
    result);
  handleSubmit(form, async () => {
    const spaceId = space.value.trim();
    const body = { spaceId };
    if (maxNodes.value) body.maxNodes = Number(maxNodes.value);
    const confirmed = await confirmDialog({
      title: `Run GC on ${spaceId}?`,
      message: 'Unreferenced, unleased nodes of this Space are deleted for good.',
      confirmLabel: 'Run GC',
      danger: true,
    });
    if (!confirmed) return;
    const r = await api('POST', appPath(appId, '/gc'), { json: body });
    fill(result, h('dl', { class: 'facts', testid: 'gc-result' },
      h('dt', {}, 'Space'), h('dd', {}, h('code', {}, spaceId)),
      h('dt', {}, 'Examined'), h('dd', { testid: 'gc-examined' }, formatCount(r.examined)),
      h('dt', {}, 'Deleted'), h('dd', { testid: 'gc-deleted' }, formatCount(r.deleted)),
      h('dt', {}, 'Reclaimed'), h('dd', {}, bytes(r.reclaimedContentBytes))));
    toast(`GC of ${spaceId}: ${plural(r.deleted, 'node')} deleted.`);
  });
  const prefill = (spaceId) => {
    space.value = spaceId;
    space.focus();
    form.scrollIntoView({ block: 'nearest' });
  };
  return { element: form, prefill };
}

/* ------------------------------------------------------------------------------------------ */
/* Paged listings: balances and events                                                         */
/* ------------------------------------------------------------------------------------------ */

function readListingParams(params) {
  const limit = Number(params.get('limit'));
  return {
    spaceId: params.get('spaceId') ?? '',
    refDomain: params.get('refDomain') ?? '',
    hash: params.get('hash') ?? '',
    limit: PAGE_SIZES.includes(limit) ? limit : DEFAULT_PAGE_SIZE,
    cursor: params.get('cursor') ?? '',
    page: Math.max(1, Number(params.get('page')) || 1),
  };
}

/**
 * A filtered listing read page by page with the API's cursor. Filters, page size and cursor
 * live in the hash (so Back and reload work) but paging only reloads the table: the URL is
 * updated with pushState, which fires no hashchange, and focus stays on the pager.
 */
function listingView(ctx, cfg) {
  const { appId } = ctx;
  let state = readListingParams(ctx.params);
  let nextCursor = null;
  let loadSeq = 0;
  let loadedSeq = 0;
  setTitle(cfg.title, appId);

  const spaceInput = h('input', { name: 'spaceId', value: state.spaceId, autocomplete: 'off', spellcheck: 'false', testid: 'filter-space' });
  const domainInput = h('input', {
    name: 'refDomain', value: state.refDomain, autocomplete: 'off', spellcheck: 'false', maxlength: 64, testid: 'filter-domain',
  });
  const hashInput = h('input', {
    name: 'hash', value: state.hash, class: 'mono', autocomplete: 'off', spellcheck: 'false', maxlength: 64, testid: 'filter-hash',
  });
  const limitSelect = h('select', { name: 'limit', value: String(state.limit), testid: 'filter-limit' },
    PAGE_SIZES.map((n) => h('option', { value: String(n) }, String(n))));
  const form = h('form', { class: 'filters', testid: `${cfg.testid}-filter`, role: 'search', 'aria-label': `Filter ${cfg.noun}` },
    field('Space (exact)', spaceInput),
    field('Domain (exact, e.g. default)', domainInput),
    field('Hash (exact, 64 hex characters)', hashInput),
    field('Rows per page', limitSelect),
    h('div', { class: 'actions' },
      h('button', { type: 'submit', testid: 'filter-submit' }, 'Apply filters'),
      h('button', { type: 'button', class: 'secondary', testid: 'filter-clear', onclick: () => clearFilters() }, 'Clear')));

  const meta = h('p', { class: 'listing-meta', testid: 'listing-meta' });
  const results = h('div', { class: 'results', tabindex: -1, testid: `${cfg.testid}-results` }, loading());
  // While a page loads the pager ignores clicks instead of being disabled: disabling the
  // focused button would throw keyboard focus back to the top of the document.
  const firstButton = h('button', {
    type: 'button', class: 'secondary', testid: 'first-page', onclick: () => loadSeq === loadedSeq && go({ ...state, cursor: '', page: 1 }),
  }, 'First page');
  const nextButton = h('button', {
    type: 'button', testid: 'next-page', onclick: () => loadSeq === loadedSeq && go({ ...state, cursor: nextCursor, page: state.page + 1 }),
  }, 'Next page');
  const pager = h('nav', { class: 'pager', 'aria-label': `${cfg.title} pages` }, firstButton, nextButton);

  mount(...appHeader(appId, cfg.tab), h('h2', {}, cfg.title), h('p', { class: 'hint' }, cfg.intro), form, meta, results, pager);

  handleSubmit(form, async () => {
    const hash = hashInput.value.trim().toLowerCase();
    hashInput.value = hash;
    if (hash && !HASH_RE.test(hash)) {
      hashInput.setAttribute('aria-invalid', 'true');
      hashInput.focus();
      throw new Error('A hash is 64 lowercase hexadecimal characters.');
    }
    hashInput.removeAttribute('aria-invalid');
    const refDomain = domainInput.value.trim();
    domainInput.value = refDomain;
    if (refDomain && !DOMAIN_RE.test(refDomain)) {
      domainInput.setAttribute('aria-invalid', 'true');
      domainInput.focus();
      throw new Error('A domain is lowercase letters and digits in parts joined by ":", starting with a letter (at most 64 characters).');
    }
    domainInput.removeAttribute('aria-invalid');
    await go({ spaceId: spaceInput.value.trim(), refDomain, hash, limit: Number(limitSelect.value), cursor: '', page: 1 });
  });

  function clearFilters() {
    spaceInput.value = '';
    domainInput.value = '';
    hashInput.value = '';
    hashInput.removeAttribute('aria-invalid');
    domainInput.removeAttribute('aria-invalid');
    clearAlert();
    go({ ...state, spaceId: '', refDomain: '', hash: '', cursor: '', page: 1 });
  }

  function go(next) {
    state = next;
    const { spaceId, refDomain, hash, limit, cursor, page } = state;
    const href = appHref(appId, cfg.tab, {
      spaceId, refDomain, hash, limit: limit === DEFAULT_PAGE_SIZE ? '' : limit, cursor, page: page > 1 ? page : '',
    });
    if (href !== window.location.hash) window.history.pushState(null, '', href);
    return load();
  }

  async function load() {
    const seq = ++loadSeq;
    const isStale = () => ctx.stale() || seq !== loadSeq;
    results.setAttribute('aria-busy', 'true');
    try {
      const data = await api('GET', appPath(appId, cfg.path), {
        query: {
          spaceId: state.spaceId, refDomain: state.refDomain, hash: state.hash, limit: state.limit, cursor: state.cursor,
        },
      });
      if (isStale()) return;
      nextCursor = data.nextCursor ?? null;
      fill(results, data.items.length
        ? cfg.render(data.items, appId)
        : h('p', { class: 'empty', testid: 'listing-empty' }, state.hash || state.spaceId || state.refDomain
          ? `No ${cfg.noun} match these filters.`
          : `No ${cfg.noun} yet.`));
      fill(meta,
        'Read at revision ', h('strong', { testid: 'listing-revision' }, formatCount(data.revision)),
        ` · page ${formatCount(state.page)} · ${plural(data.items.length, cfg.row)}`,
        nextCursor ? '' : ' · last page');
      announce(`${plural(data.items.length, cfg.row)} on page ${state.page}, read at revision ${data.revision}.`);
    } catch (err) {
      if (isStale()) return;
      nextCursor = null;
      fill(results, h('p', { class: 'empty' }, `The ${cfg.noun} could not be loaded.`));
      fill(meta);
      showError(err);
    } finally {
      if (!isStale()) {
        loadedSeq = seq;
        results.removeAttribute('aria-busy');
        const focused = document.activeElement;
        firstButton.disabled = !state.cursor;
        nextButton.disabled = !nextCursor;
        // Disabling the focused button (Next on the last page) drops focus; keep the user here.
        if (focused?.disabled) results.focus();
      }
    }
  }

  return load();
}

function balancesView(ctx) {
  return listingView(ctx, {
    tab: 'balances',
    title: 'Balances',
    testid: 'balances',
    noun: 'balances',
    row: 'balance',
    path: '/root-refs',
    intro: 'Root-ref balances: how many root refs each Space holds on each hash, per domain '
      + '(a node counts the sum over domains; a domain\'s own balance may be below zero).',
    render: (items, appId) => dataTable({
      testid: 'balances-table',
      caption: 'Root-ref balances',
      head: ['Space', 'Domain', 'Hash', numTh('Count'), hiddenTh('Links')],
      rows: items.map((b) => h('tr', { testid: 'balance-row', data: { spaceId: b.spaceId, refDomain: b.refDomain, hash: b.hash } },
        h('td', {}, h('code', { class: 'space-id' }, b.spaceId)),
        h('td', { testid: 'balance-domain' }, h('code', {}, asText(b.refDomain))),
        h('td', {}, hashView(b.hash)),
        h('td', { class: 'num', testid: 'balance-count' }, formatCount(b.refCount)),
        h('td', {}, h('a', {
          href: appHref(appId, 'events', { spaceId: b.spaceId, refDomain: b.refDomain, hash: b.hash }),
          'aria-label': `Events of ${shortHash(b.hash)} in ${b.spaceId}, domain ${b.refDomain}`,
        }, 'Events')))),
    }),
  });
}

function eventsView(ctx) {
  return listingView(ctx, {
    tab: 'events',
    title: 'Events',
    testid: 'events',
    noun: 'events',
    row: 'event',
    path: '/root-ref-events',
    intro: 'Root-ref events by revision, oldest first. Expand an event to see the changes it made.',
    render: (items) => eventsTable(items, 'events-table'),
  });
}

/** Events with a disclosure button per event that shows its changes in the next row. */
function eventsTable(events, testid, { onlyHash } = {}) {
  return dataTable({
    testid,
    caption: 'Root-ref events',
    head: [numTh('Revision'), 'Applied', 'Space', 'Domain', 'Request', 'Actor', 'Changes'],
    rows: events.flatMap((ev) => {
      const changes = Object.entries(ev.changes ?? {});
      const detailId = uid('event-changes');
      const detail = h('tr', { class: 'detail-row', id: detailId, hidden: true, testid: 'event-changes' },
        h('td', { colspan: 7 }, changesTable(changes)));
      const toggle = h('button', {
        type: 'button',
        class: 'disclosure',
        'aria-expanded': 'false',
        'aria-controls': detailId,
        testid: 'event-toggle',
        onclick: () => {
          const open = toggle.getAttribute('aria-expanded') !== 'true';
          toggle.setAttribute('aria-expanded', String(open));
          detail.hidden = !open;
        },
      }, onlyHash && ev.changes?.[onlyHash] != null
        ? `${formatDelta(ev.changes[onlyHash])} here, ${plural(changes.length, 'change')}`
        : plural(changes.length, 'change'));
      return [
        h('tr', { testid: 'event-row', data: { revision: String(ev.revision) } },
          h('td', { class: 'num' }, formatCount(ev.revision)),
          h('td', {}, time(ev.appliedAt)),
          h('td', {}, h('code', { class: 'space-id' }, ev.spaceId)),
          h('td', { testid: 'event-domain' }, h('code', {}, asText(ev.refDomain))),
          h('td', { class: 'wrap' }, h('code', {}, asText(ev.requestId))),
          h('td', { class: 'wrap' }, asText(ev.actor)),
          h('td', {}, toggle)),
        detail,
      ];
    }),
  });
}

function changesTable(changes) {
  return h('table', { class: 'nested', testid: 'changes-table' },
    h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Hash'), numTh('Delta'))),
    h('tbody', {}, changes.map(([hash, delta]) => h('tr', { testid: 'change-row', data: { hash } },
      h('td', {}, hashView(hash)),
      h('td', { class: 'num', testid: 'change-delta' }, formatDelta(delta))))));
}

/* ------------------------------------------------------------------------------------------ */
/* Reconciliation                                                                              */
/* ------------------------------------------------------------------------------------------ */

/** Per-App reconciliation state, kept while the page is open so a detour to Events loses nothing. */
const reconciliations = new Map();

function reconcileState(appId) {
  if (!reconciliations.has(appId)) {
    reconciliations.set(appId, {
      watermark: '', refDomain: 'default', text: '', file: null, comparison: null, selected: new Set(), applied: null, appliedKeys: new Set(), page: 0,
    });
  }
  return reconciliations.get(appId);
}

const balanceKey = (spaceId, hash) => `${spaceId}\u0000${hash}`;

function reconcileView(ctx) {
  const { appId } = ctx;
  const st = reconcileState(appId);
  setTitle('Reconcile', appId);

  const watermark = h('input', {
    name: 'watermark', required: true, maxlength: 256, value: st.watermark, autocomplete: 'off', spellcheck: 'false', testid: 'reconcile-watermark',
    oninput: () => { st.watermark = watermark.value; },
  });
  const domain = h('input', {
    name: 'refDomain', required: true, maxlength: 64, value: st.refDomain, autocomplete: 'off', spellcheck: 'false', testid: 'reconcile-domain',
    oninput: () => { st.refDomain = domain.value; },
  });
  const text = h('textarea', {
    name: 'balances', rows: 8, class: 'mono', spellcheck: 'false', value: st.text, testid: 'reconcile-input',
    placeholder: 'spaceId,hash,count\nnotes,2c26b46b…,1',
    oninput: () => { st.text = text.value; },
  });
  const file = h('input', { type: 'file', accept: '.csv,.json,.txt,text/csv,application/json,text/plain', testid: 'reconcile-file' });
  const fileNote = h('div', { class: 'file-note', 'aria-live': 'polite' });
  const drawFileNote = () => {
    fill(fileNote, st.file
      ? h('p', {},
        `Using the uploaded file ${st.file.name} (${formatBytes(st.file.size)}) instead of the pasted text. `,
        h('button', {
          type: 'button', class: 'secondary small', onclick: () => { st.file = null; file.value = ''; drawFileNote(); text.focus(); },
        }, 'Use the pasted text'))
      : null);
  };
  // Big files stay in memory instead of the textarea, which would slow the page down.
  file.addEventListener('change', async () => {
    const chosen = file.files?.[0];
    if (!chosen) return;
    try {
      st.file = { name: chosen.name, size: chosen.size, text: await chosen.text() };
    } catch (err) {
      st.file = null;
      showError(new Error(`The file could not be read: ${err.message}`));
    }
    drawFileNote();
  });
  drawFileNote();

  const form = h('form', { class: 'card', testid: 'reconcile-form', 'aria-labelledby': 'intended-heading' },
    h('h2', { id: 'intended-heading' }, 'Intended balances'),
    h('p', { class: 'hint' },
      'Paste or upload the balances your own records intend, as CSV lines ', h('code', {}, 'spaceId,hash,count'),
      ' (a header line is allowed) or JSON ', h('code', {}, '[{"spaceId", "hash", "count"}]'),
      '. Each Space named in the list is compared in full: a hash of that Space left out of the list is intended to be 0.'),
    field('Source watermark', watermark, 'Where your records were read, e.g. an export time or the last id: it goes into the request ids of the repairs.'),
    field('Domain', domain, 'The root-ref domain your records keep (the refDomain of your capabilities; default when they name none).'),
    field('Balances (CSV or JSON)', text),
    field('Or upload a file', file),
    fileNote,
    h('div', { class: 'actions' }, h('button', { type: 'submit', testid: 'reconcile-submit' }, 'Compare')));
  handleSubmit(form, () => compare());

  const resultArea = h('section', { 'aria-labelledby': 'differences-heading', class: 'stack' });
  const appliedArea = h('section', { 'aria-labelledby': 'applied-heading', class: 'stack' });
  mount(...appHeader(appId, 'reconcile'), form, resultArea, appliedArea);
  drawComparison();
  drawApplied();

  async function compare() {
    const source = st.file?.text ?? text.value;
    const wm = watermark.value.trim();
    const refDomain = domain.value.trim();
    if (!DOMAIN_RE.test(refDomain) || refDomain.length > 64) {
      domain.setAttribute('aria-invalid', 'true');
      domain.focus();
      throw new Error('A domain is lowercase letters and digits in parts joined by ":", starting with a letter (at most 64 characters).');
    }
    domain.removeAttribute('aria-invalid');
    if (!source.trim()) {
      text.focus();
      throw new Error('Paste or upload the intended balances first.');
    }
    let comparison;
    if (/^\s*[[{]/.test(source)) {
      let parsed;
      try {
        parsed = JSON.parse(source);
      } catch (err) {
        throw new Error(`The JSON could not be parsed: ${err.message}`);
      }
      const balances = Array.isArray(parsed) ? parsed : parsed?.balances;
      if (!Array.isArray(balances)) {
        throw new Error('JSON input is an array of {"spaceId", "hash", "count"} or an object with a "balances" array.');
      }
      comparison = await api('POST', appPath(appId, '/reconcile'), { json: { watermark: wm, refDomain, balances } });
    } else {
      comparison = await api('POST', appPath(appId, '/reconcile'), {
        query: { watermark: wm, refDomain }, body: source, contentType: 'text/csv',
      });
    }
    // Kept even if the user has left the page: it is there when they come back.
    Object.assign(st, { comparison, selected: new Set(), applied: null, appliedKeys: new Set(), page: 0 });
    if (ctx.stale()) return;
    drawComparison();
    drawApplied();
    document.getElementById('differences-heading')?.focus();
    announce(`${plural(comparison.differences.length, 'difference')} found.`);
  }

  function drawComparison() {
    const c = st.comparison;
    if (!c) {
      fill(resultArea);
      return;
    }
    const diffs = c.differences;
    const summary = h('p', { testid: 'reconcile-summary', class: 'summary' },
      `Compared ${plural(c.compared, 'intended balance')} of domain ${c.refDomain} with CAS at revision ${formatCount(c.revision)} `,
      `(watermark “${c.watermark}”): `, h('strong', { testid: 'difference-count' }, plural(diffs.length, 'difference')), '.');
    if (diffs.length === 0) {
      fill(resultArea, h('h2', { id: 'differences-heading', tabindex: -1 }, 'Differences'), summary,
        h('p', { class: 'ok', testid: 'reconcile-match' }, '✓ CAS matches every intended balance.'));
      return;
    }

    const selectable = diffs.filter((d) => !st.appliedKeys.has(balanceKey(d.spaceId, d.hash)));
    const selectAll = h('input', { type: 'checkbox', id: uid('select-all'), testid: 'diff-select-all' });
    const selectedCount = h('span', { testid: 'selected-count' });
    const applyButton = h('button', { type: 'button', testid: 'apply-button', onclick: () => apply() });
    const updateSelection = () => {
      const n = st.selected.size;
      selectAll.checked = n > 0 && n === selectable.length;
      selectAll.indeterminate = n > 0 && n < selectable.length;
      selectAll.disabled = selectable.length === 0;
      selectedCount.textContent = `${formatCount(n)} of ${plural(diffs.length, 'difference')} selected`;
      applyButton.disabled = n === 0;
      applyButton.textContent = n === 0 ? 'Apply selected repairs' : `Apply ${plural(n, 'repair')}…`;
    };
    const checkboxes = [];
    selectAll.addEventListener('change', () => {
      st.selected = selectAll.checked ? new Set(selectable.map((d) => balanceKey(d.spaceId, d.hash))) : new Set();
      for (const box of checkboxes) box.checked = st.selected.has(box.dataset.key);
      updateSelection();
    });

    const pageCount = Math.ceil(diffs.length / DIFF_PAGE_SIZE);
    st.page = Math.min(st.page, pageCount - 1);
    const shown = diffs.slice(st.page * DIFF_PAGE_SIZE, (st.page + 1) * DIFF_PAGE_SIZE);
    const rows = shown.flatMap((d) => {
      const key = balanceKey(d.spaceId, d.hash);
      const applied = st.appliedKeys.has(key);
      const box = h('input', {
        type: 'checkbox',
        testid: 'diff-select',
        checked: st.selected.has(key),
        disabled: applied,
        data: { key },
        'aria-label': `Repair ${shortHash(d.hash)} in ${d.spaceId} by ${formatDelta(d.delta)}`,
        onchange: () => {
          if (box.checked) st.selected.add(key); else st.selected.delete(key);
          updateSelection();
        },
      });
      checkboxes.push(box);
      const detailId = uid('diff-events');
      const detail = h('tr', { class: 'detail-row', id: detailId, hidden: true, testid: 'diff-events' },
        h('td', { colspan: 7 }, d.events.length
          ? eventsTable(d.events, 'diff-events-table', { onlyHash: d.hash })
          : h('p', {}, 'No event touched this hash.')));
      const toggle = h('button', {
        type: 'button',
        class: 'disclosure',
        'aria-expanded': 'false',
        'aria-controls': detailId,
        testid: 'diff-events-toggle',
        onclick: () => {
          const open = toggle.getAttribute('aria-expanded') !== 'true';
          toggle.setAttribute('aria-expanded', String(open));
          detail.hidden = !open;
        },
      }, plural(d.events.length, 'event'));
      return [
        h('tr', { testid: 'diff-row', class: applied ? 'applied' : null, data: { spaceId: d.spaceId, hash: d.hash } },
          h('td', {}, box),
          h('td', {}, h('code', { class: 'space-id' }, d.spaceId)),
          h('td', {}, hashView(d.hash)),
          h('td', { class: 'num', testid: 'diff-intended' }, formatCount(d.intended)),
          h('td', { class: 'num', testid: 'diff-actual' }, formatCount(d.actual)),
          h('td', { class: 'num', testid: 'diff-delta' }, formatDelta(d.delta), applied ? [' ', h('span', { class: 'badge badge-ok' }, 'applied')] : null),
          h('td', {}, toggle)),
        detail,
      ];
    });

    const pager = pageCount > 1
      ? h('nav', { class: 'pager', 'aria-label': 'Difference pages' },
        h('button', { type: 'button', class: 'secondary', disabled: st.page === 0, onclick: () => { st.page -= 1; drawComparison(); focusDiffTable(); } }, 'Previous'),
        h('span', {}, `Rows ${formatCount(st.page * DIFF_PAGE_SIZE + 1)}–${formatCount(st.page * DIFF_PAGE_SIZE + shown.length)} of ${formatCount(diffs.length)}`),
        h('button', { type: 'button', class: 'secondary', disabled: st.page === pageCount - 1, onclick: () => { st.page += 1; drawComparison(); focusDiffTable(); } }, 'Next'))
      : null;

    fill(resultArea,
      h('h2', { id: 'differences-heading', tabindex: -1 }, 'Differences'),
      summary,
      h('p', { class: 'hint' }, 'Delta is intended − actual: the change that makes CAS match. Choose the repairs to apply.'),
      selectable.length
        ? h('div', { class: 'toolbar' },
          h('label', { class: 'check', for: selectAll.id }, selectAll, ` Select all ${plural(selectable.length, 'difference')}`),
          selectedCount, applyButton)
        : h('p', { class: 'hint', testid: 'all-applied' }, 'Every difference has been repaired; compare again to check.'),
      dataTable({
        testid: 'diff-table',
        caption: 'Differences between intended and CAS balances',
        head: [hiddenTh('Selected'), 'Space', 'Hash',
          numTh('Intended'), numTh('Actual'), numTh('Delta'), 'Events'],
        rows,
      }),
      pager);
    updateSelection();
  }

  function focusDiffTable() {
    resultArea.querySelector('.table-wrap')?.focus();
  }

  async function apply() {
    const c = st.comparison;
    const chosen = c.differences.filter((d) => st.selected.has(balanceKey(d.spaceId, d.hash)));
    if (chosen.length === 0) return;
    const confirmed = await confirmDialog({
      title: `Apply ${plural(chosen.length, 'repair')}?`,
      message: h('p', {},
        'Each chosen balance is changed by its delta with ordinary root-ref updates in domain ', h('code', {}, c.refDomain),
        ' (one event per Space) recorded with watermark ', h('code', {}, c.watermark), '. Balances are read back afterwards.'),
      confirmLabel: 'Apply repairs',
      danger: true,
    });
    if (!confirmed) return;
    clearAlert();
    try {
      const result = await api('POST', appPath(appId, '/reconcile/apply'), {
        json: { watermark: c.watermark, refDomain: c.refDomain, repairs: chosen.map(({ spaceId, hash, delta }) => ({ spaceId, hash, delta })) },
      });
      for (const d of chosen) st.appliedKeys.add(balanceKey(d.spaceId, d.hash));
      st.applied = { result, repairs: chosen };
      st.selected = new Set();
      if (ctx.stale()) return;
      drawComparison();
      drawApplied();
      document.getElementById('applied-heading')?.focus();
      const matched = appliedRows().filter((r) => r.matches).length;
      announce(`Applied. ${matched} of ${chosen.length} balances now match.`);
    } catch (err) {
      showError(err);
    }
  }

  /** The verified result per repaired balance: the count read back against the intended one. */
  function appliedRows() {
    const { result, repairs } = st.applied;
    const readBack = new Map(result.balances.map((b) => [balanceKey(b.spaceId, b.hash), b.refCount]));
    return repairs.map((d) => {
      const key = balanceKey(d.spaceId, d.hash);
      // A balance that reached 0 may be absent from the read-back: no balance is a count of 0.
      const refCount = readBack.get(key) ?? 0;
      return { ...d, refCount, matches: refCount === d.intended };
    });
  }

  function drawApplied() {
    if (!st.applied) {
      fill(appliedArea);
      return;
    }
    const { result } = st.applied;
    const rows = appliedRows();
    const mismatches = rows.filter((r) => !r.matches).length;
    fill(appliedArea,
      h('h2', { id: 'applied-heading', tabindex: -1 }, 'Verified result'),
      h('p', { testid: 'applied-summary', class: mismatches ? 'warn' : 'ok' },
        `Applied at revision ${formatCount(result.revision)}; balances read back at that revision: `,
        mismatches
          ? `${plural(mismatches, 'balance')} still ${mismatches === 1 ? 'differs' : 'differ'} from the intended count.`
          : rows.length === 1
            ? 'the repaired balance matches its intended count.'
            : `all ${formatCount(rows.length)} repaired balances match their intended counts.`),
      dataTable({
        testid: 'applied-table',
        caption: 'Balances after the repair',
        head: ['Space', 'Hash', numTh('Intended'), numTh('Count now'), 'Matches'],
        rows: rows.map((r) => h('tr', { testid: 'applied-row', data: { spaceId: r.spaceId, hash: r.hash } },
          h('td', {}, h('code', { class: 'space-id' }, r.spaceId)),
          h('td', {}, hashView(r.hash)),
          h('td', { class: 'num' }, formatCount(r.intended)),
          h('td', { class: 'num', testid: 'applied-refcount' }, formatCount(r.refCount)),
          h('td', { testid: 'applied-match', data: { match: String(r.matches) } },
            r.matches
              ? h('span', { class: 'check-mark' }, h('span', { 'aria-hidden': 'true' }, '✓ '), 'Matches')
              : h('span', { class: 'cross-mark' }, h('span', { 'aria-hidden': 'true' }, '✗ '), 'Differs')))),
      }),
      h('details', { class: 'updates' },
        h('summary', {}, `${plural(result.updates.length, 'root-ref update')} applied`),
        dataTable({
          testid: 'applied-updates',
          caption: 'Root-ref updates of the repair',
          head: ['Space', 'Request', numTh('Revision'), 'Idempotent'],
          rows: result.updates.map((u) => h('tr', {},
            h('td', {}, h('code', { class: 'space-id' }, u.spaceId)),
            h('td', { class: 'wrap' }, h('code', {}, asText(u.requestId))),
            h('td', { class: 'num' }, formatCount(u.revision)),
            h('td', {}, u.idempotent ? 'yes (already applied)' : 'no'))),
        })),
      h('div', { class: 'actions' },
        h('button', { type: 'button', class: 'secondary', testid: 'reconcile-again', onclick: () => form.requestSubmit() }, 'Compare again')));
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Issuer keys                                                                                 */
/* ------------------------------------------------------------------------------------------ */

async function keysView(ctx) {
  const { appId } = ctx;
  setTitle('Keys', appId);
  let keys = [];
  const list = h('div', {}, loading());

  const kid = h('input', { name: 'kid', required: true, maxlength: 256, autocomplete: 'off', spellcheck: 'false', testid: 'key-kid' });
  const alg = h('select', { name: 'alg', testid: 'key-alg' }, KEY_ALGORITHMS.map((a) => h('option', { value: a }, a)));
  const pem = h('textarea', {
    name: 'publicKeyPem', required: true, rows: 6, class: 'mono', spellcheck: 'false', testid: 'key-pem',
    placeholder: '-----BEGIN PUBLIC KEY-----\n…\n-----END PUBLIC KEY-----',
  });
  const form = h('form', { class: 'card', testid: 'key-form', 'aria-labelledby': 'add-key-heading' },
    h('h2', { id: 'add-key-heading' }, 'Add an issuer key'),
    h('div', { class: 'form-row' }, field('Key ID (kid)', kid), field('Algorithm', alg)),
    field('Public key (PEM)', pem, 'The public half only, e.g. the output of openssl pkey -pubout.'),
    h('div', { class: 'actions' }, h('button', { type: 'submit', testid: 'key-submit' }, 'Add key')));
  handleSubmit(form, async () => {
    const { key } = await api('POST', appPath(appId, '/keys'), {
      json: { kid: kid.value.trim(), alg: alg.value, publicKeyPem: pem.value.trim() },
    });
    keys = [...keys.filter((k) => k.kid !== key.kid), key];
    draw();
    form.reset();
    toast(`Key ${key.kid} added.`);
  });

  mount(...appHeader(appId, 'keys'),
    h('section', { 'aria-labelledby': 'keys-heading', class: 'stack' },
      h('h2', { id: 'keys-heading', tabindex: -1 }, 'Issuer keys'),
      h('p', { class: 'hint' }, 'Capabilities of this App are verified with these public keys.'),
      list),
    form);

  const draw = () => {
    fill(list, keys.length ? dataTable({
      testid: 'keys-table',
      caption: 'Issuer keys',
      head: ['Key ID', 'Algorithm', 'Added', 'Status', hiddenTh('Actions')],
      rows: keys.map((k) => h('tr', { testid: 'key-row', data: { kid: k.kid } },
        h('th', { scope: 'row' }, h('code', {}, k.kid)),
        h('td', {}, k.alg),
        h('td', {}, time(k.createdAt)),
        h('td', { testid: 'key-status' }, k.revokedAt != null
          ? h('span', {}, h('span', { class: 'badge badge-warn' }, 'Revoked'), ' ', time(k.revokedAt))
          : h('span', { class: 'badge badge-ok' }, 'Active')),
        h('td', {}, k.revokedAt == null
          ? h('button', { type: 'button', class: 'danger small', testid: 'key-revoke', 'aria-label': `Revoke key ${k.kid}`, onclick: () => revoke(k) }, 'Revoke…')
          : null))),
    }) : h('p', { testid: 'keys-empty' }, 'No issuer key yet: no capability of this App can be verified.'));
  };

  const revoke = async (k) => {
    const confirmed = await confirmDialog({
      title: `Revoke key ${k.kid}?`,
      message: 'Capabilities signed with this key will be refused from now on. A revoked key cannot be restored.',
      confirmLabel: 'Revoke key',
      danger: true,
    });
    if (!confirmed) return;
    clearAlert();
    try {
      const { key } = await api('POST', appPath(appId, `/keys/${enc(k.kid)}/revoke`));
      keys = keys.map((x) => (x.kid === k.kid ? (key ?? { ...x, revokedAt: Date.now() }) : x));
      draw();
      document.getElementById('keys-heading')?.focus();
      toast(`Key ${k.kid} revoked.`);
    } catch (err) {
      showError(err);
    }
  };

  const detail = await api('GET', appPath(appId));
  if (ctx.stale()) return;
  keys = detail.keys;
  draw();
}

/* ------------------------------------------------------------------------------------------ */
/* Members                                                                                     */
/* ------------------------------------------------------------------------------------------ */

async function membersView(ctx) {
  const { appId } = ctx;
  setTitle('Members', appId);
  let members = [];
  const list = h('div', {}, loading());

  const email = h('input', { name: 'email', type: 'email', required: true, autocomplete: 'off', testid: 'member-email' });
  const form = h('form', { class: 'card', testid: 'member-form', 'aria-labelledby': 'add-member-heading' },
    h('h2', { id: 'add-member-heading' }, 'Add a member'),
    field('Email', email, 'The account with this email may administer this App; it is created on first sign-in if needed.'),
    h('div', { class: 'actions' }, h('button', { type: 'submit', testid: 'member-submit' }, 'Add member')));
  handleSubmit(form, async () => {
    const { member } = await api('POST', appPath(appId, '/members'), { json: { email: email.value.trim() } });
    members = [...members.filter((m) => m.accountId !== member.accountId), member];
    draw();
    form.reset();
    toast(`${member.email ?? member.displayName} added.`);
  });

  mount(...appHeader(appId, 'members'),
    h('section', { 'aria-labelledby': 'members-heading', class: 'stack' },
      h('h2', { id: 'members-heading', tabindex: -1 }, 'Members'),
      h('p', { class: 'hint' }, 'Accounts that may administer this App.'),
      list),
    form);

  const draw = () => {
    fill(list, members.length ? dataTable({
      testid: 'members-table',
      caption: 'Members',
      head: ['Name', 'Email', 'Account', hiddenTh('Actions')],
      rows: members.map((m) => h('tr', { testid: 'member-row', data: { accountId: m.accountId, email: m.email ?? '' } },
        h('th', { scope: 'row' }, m.displayName || '—'),
        h('td', { class: 'wrap' }, m.email ?? '—'),
        h('td', {}, h('code', {}, m.accountId)),
        h('td', {}, h('button', {
          type: 'button', class: 'danger small', testid: 'member-remove', 'aria-label': `Remove ${m.email ?? m.displayName}`, onclick: () => remove(m),
        }, 'Remove…')))),
    }) : h('p', { testid: 'members-empty' }, 'No members.'));
  };

  const remove = async (m) => {
    const who = m.email ?? m.displayName ?? m.accountId;
    const confirmed = await confirmDialog({
      title: `Remove ${who}?`,
      message: `${who} will no longer be able to administer ${appId}.`,
      confirmLabel: 'Remove member',
      danger: true,
    });
    if (!confirmed) return;
    clearAlert();
    try {
      await api('DELETE', appPath(appId, `/members/${enc(m.accountId)}`));
      members = members.filter((x) => x.accountId !== m.accountId);
      draw();
      document.getElementById('members-heading')?.focus();
      toast(`${who} removed.`);
    } catch (err) {
      showError(err);
    }
  };

  const detail = await api('GET', appPath(appId));
  if (ctx.stale()) return;
  members = detail.members;
  draw();
}

/* ------------------------------------------------------------------------------------------ */

function notFoundView() {
  setTitle('Not found');
  mount(h('h1', { tabindex: -1 }, 'Page not found'),
    h('p', {}, 'There is no such page. ', h('a', { href: '#/apps' }, 'Go to the Apps.')));
}

async function start() {
  els.logout.addEventListener('click', logout);
  bindSkeleton();
  window.addEventListener('hashchange', () => route());

  try {
    session = await api('GET', '/session');
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      renderSignIn();
    } else {
      mount(h('h1', { tabindex: -1 }, 'UniCAS admin'), h('p', {}, 'The admin API is not available.'));
      showError(err);
    }
    return;
  }
  renderAccount();
  if (!parseRoute().segments.length) window.history.replaceState(null, '', '#/apps');
  route({ initial: true });
}

start();
