// The live console: a tenant's pools as quota and capacity bars, an event feed with the
// change diffs, and the owner's lending view, kept current by the poolEvents
// subscription (graphql-transport-ws) without polling. A lost connection reconnects and
// resumes after the last cursor it saw. Plain JavaScript, no dependencies, no build step.
//
// The state comes from one `Console` query at load; events then patch it in place:
//   pool.usage                  its rows are the rows after a booking or release (CONTRACT 10)
//   pool.updated                `data.changes` patches what the page shows (/gpuModel ...)
//   created/offered/unoffered/archived   who sees what changed: the state is read again
// `window.bcConsole.applyEvent(event)` is the function the stream feeds: a PoolEvent as
// the subscription delivers it ({cursor, type, poolId, tenantId, occurredAt, data}).
"use strict";

const UNLIMITED = 2147483647; // an owner's quota rows: no limit but capacity
const FEED_LIMIT = 200; // feed entries kept on the page
const RECONNECT_MIN_MS = 500;
const RECONNECT_MAX_MS = 10000;

const poolFields = (extra) => `id ${extra} tenantId class gpuModel region owned archived version
  quotas { resource max used grant { tenantId } }
  capacity { resource total allocatable booked available }
  offers { tenantId quotas { resource max used } }`;
const poolsQuery = (extra) => `query ConsolePools($t: String!, $after: String) {
  pools(tenantId: $t, first: 100, after: $after) {
    nodes { ${poolFields(extra)} } pageInfo { hasNextPage endCursor } } }`;
// Its own request: without compute:pools:share the whole answer is PERMISSION_DENIED.
const LENDING = `query ConsoleLending($t: String!) { lending(tenantId: $t, first: 100) {
  poolId resource total allocatable booked available offered guestUsed overcommit } }`;
const EVENTS = `subscription ConsoleEvents($t: String!, $after: String) {
  poolEvents(tenantId: $t, after: $after) { cursor type poolId tenantId occurredAt data } }`;
// Whether Pool has displayName (issue 23): asked once, never assumed.
const POOL_FIELDS = `query PoolFields { __type(name: "Pool") { fields { name } } }`;

const $ = (id) => document.getElementById(id);

// Everything the page shows, in one place.
const state = {
  token: "",
  tenant: "",
  session: 0, // a new "Show" ends the previous session's socket and timers
  pools: new Map(), // id -> pool (see poolFromQuery)
  lending: [], // LendingRow objects, as the lending query answers them
  lendingNote: "",
  feed: [], // newest first
  cursor: null, // the last cursor received: the `after` of the next subscribe
  displayName: null, // whether the schema has Pool.displayName; null: not asked yet
  status: "idle",
  socket: null,
  paused: false,
  reloadTimer: null,
  retryTimer: null,
  loaded: false, // the state was read at least once this session
  loading: null, // the in-flight load: events that arrive meanwhile wait for it
  pending: [],
};

class ServiceError extends Error {
  // kind: "auth" (token refused: stop), "denied" (the token may not read the tenant:
  // stop), "down" (service unreachable or failing: retry).
  constructor(kind, message) {
    super(message);
    this.kind = kind;
  }
}

const label = (pool) => (pool && pool.displayName) || (pool ? pool.id : "");
const amount = (n) => (n === UNLIMITED ? "unlimited" : String(n));
const rowKey = (tenantId, resource) => `${tenantId}\u0000${resource}`;

// ---- reading the state ------------------------------------------------------------

async function graphql(query, variables) {
  let response;
  try {
    response = await fetch("/graphql", {
      method: "POST",
      headers: { "content-type": "application/json",
                 accept: "application/graphql-response+json, application/json",
                 authorization: `Bearer ${state.token}` },
      body: JSON.stringify({ query, variables }),
    });
  } catch (error) {
    throw new ServiceError("down", `The service at ${location.host} is not reachable.`);
  }
  let body;
  try {
    body = await response.json();
  } catch (error) {
    throw new ServiceError("down", `The service answered HTTP ${response.status}.`);
  }
  const first = (body.errors || [])[0];
  const code = first && first.extensions && first.extensions.code;
  if (response.status === 401 || code === "UNAUTHENTICATED") {
    throw new ServiceError("auth", "The token was refused (UNAUTHENTICATED): paste a valid one.");
  }
  if (!body.data) {
    const message = (body.errors || []).map((e) => e.message).join("; ");
    const kind = code === "PERMISSION_DENIED" || code === "NOT_FOUND" || code === "INVALID_INPUT"
      ? "denied" : "down";
    throw new ServiceError(kind, `${code || `HTTP ${response.status}`}: ${message}`);
  }
  return body;
}

async function hasDisplayName() {
  try {
    const body = await graphql(POOL_FIELDS, {});
    const type = body.data.__type;
    return Boolean(type && type.fields.some((f) => f.name === "displayName"));
  } catch (error) {
    if (error.kind === "auth" || error.kind === "down") throw error;
    return false; // introspection switched off: show ids
  }
}

// A pool as the page keeps it: quota rows per (tenant, resource), capacity per resource.
function poolFromQuery(node, viewer) {
  const quotas = new Map();
  for (const q of node.quotas) {
    const tenantId = q.grant ? q.grant.tenantId : viewer;
    quotas.set(rowKey(tenantId, q.resource), { tenantId, resource: q.resource, max: q.max, used: q.used });
  }
  // The owner's view (compute:pools:share): every tenant's rows, through its offers.
  for (const offer of node.offers || []) {
    for (const q of offer.quotas) {
      quotas.set(rowKey(offer.tenantId, q.resource),
        { tenantId: offer.tenantId, resource: q.resource, max: q.max, used: q.used });
    }
  }
  const capacity = node.capacity === null ? null
    : new Map(node.capacity.map((c) => [c.resource, { ...c }]));
  return {
    id: node.id,
    displayName: node.displayName ?? null,
    tenantId: node.tenantId,
    class: node.class,
    gpuModel: node.gpuModel,
    region: node.region,
    owned: node.owned,
    archived: node.archived,
    version: node.version,
    quotas,
    capacity,
    allRows: node.offers !== null && node.offers !== undefined, // every tenant's rows known
  };
}

async function loadState() {
  const mine = state.session;
  if (state.displayName === null) state.displayName = await hasDisplayName();
  const query = poolsQuery(state.displayName ? "displayName" : "");
  const lendingAnswer = graphql(LENDING, { t: state.tenant }).then(
    (body) => ({ rows: body.data.lending, note: "" }),
    (error) => {
      if (error.kind === "denied") return { rows: [], note: `Lending is not shown: ${error.message}` };
      throw error;
    });
  lendingAnswer.catch(() => {}); // awaited below; a failure of the pools read comes first
  const pools = new Map();
  const notes = [];
  let after = null;
  for (;;) {
    const body = await graphql(query, { t: state.tenant, after });
    for (const error of body.errors || []) {
      const where = (error.path || []).join(".");
      // A part this token may not read (capacity, offers): the rest of the pool shows.
      notes.push(/\.(capacity|offers)$/.test(where)
        ? `${where.split(".").pop()} not shown: ${error.message}` : error.message);
    }
    for (const node of body.data.pools.nodes) pools.set(node.id, poolFromQuery(node, state.tenant));
    const page = body.data.pools.pageInfo;
    if (!page.hasNextPage) break;
    after = page.endCursor;
  }
  const { rows: lending, note: lendingNote } = await lendingAnswer;
  if (mine !== state.session) return;
  state.pools = pools;
  state.lending = lending.map((row) => ({ ...row }));
  state.lendingNote = lendingNote;
  state.loaded = true;
  $("notes").textContent = [...new Set(notes)].join(" · ");
}

// Load the state; events that arrive while it loads are applied after it.
async function reload() {
  const loading = loadState();
  state.loading = loading;
  try {
    await loading;
  } finally {
    if (state.loading === loading) {
      state.loading = null;
      const pending = state.pending;
      state.pending = [];
      for (const event of pending) applyEvent(event);
    }
  }
  render();
}

function scheduleReload() {
  if (state.reloadTimer !== null) return;
  state.reloadTimer = setTimeout(async () => {
    state.reloadTimer = null;
    try {
      await reload();
    } catch (error) {
      failed(error);
    }
  }, 100);
}

// ---- applying events ----------------------------------------------------------------

// JSON Pointer paths of `data.changes` that the page shows, patched in place.
const PATCHES = {
  "/gpuModel": (pool, value) => { pool.gpuModel = value; },
  "/displayName": (pool, value) => { pool.displayName = value; },
};

// CONTRACT 10: `data` is {"quotas": [{tenantId, resource, max, used}],
// "capacity": [{resource, booked, available}]}, the rows after the change.
function applyUsage(pool, data) {
  for (const q of data.quotas || []) {
    pool.quotas.set(rowKey(q.tenantId, q.resource),
      { tenantId: q.tenantId, resource: q.resource, max: q.max, used: q.used });
  }
  for (const c of data.capacity || []) {
    if (pool.capacity === null) break; // this caller does not read capacity
    const row = pool.capacity.get(c.resource) || { resource: c.resource, total: null };
    row.booked = c.booked;
    row.available = c.available;
    row.allocatable = c.booked + c.available; // available = allocatable - booked
    pool.capacity.set(c.resource, row);
  }
  // The lender's rows of this pool: what the guests (every tenant but the owner) hold.
  for (const row of state.lending) {
    if (row.poolId !== pool.id) continue;
    const cap = pool.capacity && pool.capacity.get(row.resource);
    if (cap) {
      row.booked = cap.booked;
      row.available = cap.available;
      row.allocatable = cap.allocatable;
    }
    if (pool.allRows) {
      row.guestUsed = [...pool.quotas.values()]
        .filter((q) => q.resource === row.resource && q.tenantId !== pool.tenantId)
        .reduce((sum, q) => sum + q.used, 0);
    }
  }
}

function applyEvent(event) {
  if (event.cursor) state.cursor = event.cursor;
  if (state.loading) { // the state being loaded may predate the event: apply it after
    state.pending.push(event);
    addToFeed(event);
    return;
  }
  const pool = state.pools.get(event.poolId);
  const data = event.data || {};
  if (event.type === "pool.usage") {
    if (pool) applyUsage(pool, data); else scheduleReload();
  } else if (event.type === "pool.updated" && pool) {
    // Paths the page does not show (/policy/..., /labels) need nothing.
    for (const c of data.changes || []) if (c.path in PATCHES) PATCHES[c.path](pool, c.after);
    if (typeof data.version === "number") pool.version = data.version;
  } else {
    // Created, offered, unoffered, archived: which pools and rows the tenant sees moved.
    scheduleReload();
  }
  addToFeed(event);
  render();
}

function addToFeed(event) {
  if (!event.__fed) {
    Object.defineProperty(event, "__fed", { value: true });
    state.feed.unshift(event);
    state.feed.length = Math.min(state.feed.length, FEED_LIMIT);
  }
}

// ---- the connection -------------------------------------------------------------------

function setStatus(status, detail = "") {
  state.status = status;
  $("status").dataset.state = status;
  $("status").textContent = status;
  $("connection").textContent = detail;
  $("pause").disabled = !["live", "paused", "connecting", "offline"].includes(status);
  $("pause").textContent = state.paused ? "Resume" : "Pause";
}

function failed(error) {
  showError(error.message);
  if (error.kind === "auth" || error.kind === "denied") {
    stop();
    setStatus("error");
  } else { // the service failed to answer: read again in a while, the stream stays
    const mine = state.session;
    setTimeout(() => { if (mine === state.session) scheduleReload(); }, 2000);
  }
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

function stop() {
  state.session += 1;
  if (state.socket) state.socket.close(1000, "console: stopped");
  state.socket = null;
  clearTimeout(state.reloadTimer);
  clearTimeout(state.retryTimer);
  state.reloadTimer = null;
  state.retryTimer = null;
}

// Follow the stream: subscribe with `after` = the last cursor, so a reconnect resumes
// where it stopped; with no cursor yet, read the state after subscribing instead.
function follow(mine, delay = RECONNECT_MIN_MS) {
  if (mine !== state.session || state.paused) return;
  const retry = (why) => {
    if (mine !== state.session || state.paused) return;
    const wait = Math.min(delay, RECONNECT_MAX_MS);
    const detail = `${why} Reconnecting in ${(wait / 1000).toFixed(1)} s` +
      (state.cursor ? ", resuming after the last event seen." : ".");
    setStatus("offline", detail);
    showError(detail);
    state.retryTimer = setTimeout(() => {
      state.retryTimer = null;
      follow(mine, delay * 2);
    }, wait);
  };
  setStatus("connecting", state.cursor ? "resuming after the last event seen" : "");
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/graphql`;
  const ws = new WebSocket(url, "graphql-transport-ws");
  state.socket = ws;
  let acked = false;
  ws.onopen = () => ws.send(JSON.stringify(
    { type: "connection_init", payload: { authorization: `Bearer ${state.token}` } }));
  ws.onmessage = async (message) => {
    if (mine !== state.session || ws !== state.socket) return;
    const msg = JSON.parse(message.data);
    if (msg.type === "connection_ack") {
      acked = true;
      delay = RECONNECT_MIN_MS;
      const resumed = state.cursor !== null;
      ws.send(JSON.stringify({ id: "events", type: "subscribe",
        payload: { query: EVENTS, variables: { t: state.tenant, after: state.cursor } } }));
      setStatus("live", resumed ? "resumed after the last event seen" : "");
      showError("");
      if (!resumed) { // nothing to resume from: what changed while away is read instead
        try {
          await reload();
        } catch (error) {
          failed(error);
        }
      }
    } else if (msg.type === "ping") {
      ws.send(JSON.stringify({ type: "pong" }));
    } else if (msg.type === "next") {
      const errors = msg.payload.errors;
      if (errors && errors.length) {
        subscriptionFailed(ws, errors[0]);
        return;
      }
      applyEvent(msg.payload.data.poolEvents);
    } else if (msg.type === "error") {
      subscriptionFailed(ws, (msg.payload || [])[0] || { message: "subscription refused" });
    } else if (msg.type === "complete") {
      ws.close(1000, "console: resubscribing");
    }
  };
  ws.onclose = (event) => {
    if (mine !== state.session || ws !== state.socket) return;
    state.socket = null;
    if (event.code === 4403) {
      stop();
      setStatus("error");
      showError("The token was refused (UNAUTHENTICATED): paste a valid one.");
      return;
    }
    if (state.paused) {
      setStatus("paused", state.cursor ? "Resume picks up after the last event seen." : "");
      return;
    }
    retry(acked ? "The connection was lost." : "The service is not reachable.");
  };
}

function subscriptionFailed(ws, error) {
  const ext = error.extensions || {};
  if (ext.reason === "CURSOR_EXPIRED") {
    state.cursor = null; // read the state again, then follow from now
  } else if (ext.code === "UNAUTHENTICATED" || ext.code === "PERMISSION_DENIED"
             || ext.code === "NOT_FOUND" || ext.code === "INVALID_INPUT") {
    failed(new ServiceError(ext.code === "UNAUTHENTICATED" ? "auth" : "denied",
      `${ext.code}: ${error.message}`));
    return;
  }
  showError(`${ext.code || "error"}: ${error.message}`);
  ws.close(1000, "console: resubscribing"); // onclose reconnects, resuming after the cursor
}

function pause() {
  if (state.paused) {
    state.paused = false;
    follow(state.session);
  } else {
    state.paused = true;
    clearTimeout(state.retryTimer);
    state.retryTimer = null;
    if (state.socket) state.socket.close(1000, "console: paused");
    else setStatus("paused");
  }
}

async function show(token, tenant) {
  stop();
  const mine = state.session;
  Object.assign(state, { token, tenant, pools: new Map(), lending: [], lendingNote: "",
                         feed: [], cursor: null, displayName: null, paused: false, pending: [],
                         loaded: false });
  showError("");
  $("notes").textContent = "";
  render();
  // A bad token or a service that is down shows at once, not after the socket's retries.
  try {
    state.displayName = await hasDisplayName();
  } catch (error) {
    if (mine !== state.session) return;
    if (error.kind !== "down") { failed(error); return; }
  }
  follow(mine); // subscribes, then reads the state (no cursor yet)
}

// ---- rendering --------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null) continue;
    if (key === "text") node.textContent = value;
    else if (key.startsWith("data-")) node.setAttribute(key, String(value));
    else node[key] = value;
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

function bar(attrs, caption, value, max) {
  const ratio = max > 0 && max !== UNLIMITED ? Math.min(value / max, 1) : 0;
  const level = max === UNLIMITED ? "unlimited" : ratio >= 0.9 ? "high" : ratio >= 0.7 ? "mid" : "low";
  const fill = el("span", { className: "fill" });
  fill.style.width = `${(ratio * 100).toFixed(1)}%`; // CSSOM: allowed by the page's policy
  return el("div", { className: "bar", ...attrs, "data-level": level, role: "meter",
                     ariaLabel: caption, ariaValueNow: value, ariaValueMax: max },
    el("span", { className: "caption", text: caption, title: caption }),
    el("span", { className: "track" }, fill),
    el("span", { className: "value", text: `${value} / ${amount(max)}` }));
}

function renderPool(pool) {
  const rows = [...pool.quotas.values()].sort((a, b) =>
    (a.tenantId === state.tenant ? -1 : 0) - (b.tenantId === state.tenant ? -1 : 0)
    || a.tenantId.localeCompare(b.tenantId) || a.resource.localeCompare(b.resource));
  const quotaBars = rows.map((q) => bar(
    { "data-kind": "quota", "data-pool-id": pool.id, "data-tenant-id": q.tenantId,
      "data-resource": q.resource, "data-used": q.used, "data-max": q.max },
    `${q.tenantId} · ${q.resource}`, q.used, q.max));
  const capacity = pool.capacity === null
    ? [el("p", { className: "muted", text: "capacity not readable with this token" })]
    : [...pool.capacity.values()].sort((a, b) => a.resource.localeCompare(b.resource)).map((c) =>
      bar({ "data-kind": "capacity", "data-pool-id": pool.id, "data-resource": c.resource,
            "data-booked": c.booked, "data-allocatable": c.allocatable },
          `${c.resource} booked`, c.booked, c.allocatable));
  const kind = String(pool.class).toLowerCase().replace(/_/g, "-"); // METAL_HOST: metal-host
  const facts = [kind, pool.gpuModel, pool.region, pool.owned ? "owned" : `from ${pool.tenantId}`,
    `v${pool.version}`, pool.archived ? "archived" : null].filter(Boolean).join(" · ");
  return el("article", { className: "pool", "data-pool-id": pool.id },
    el("h3", {}, el("span", { className: "name", text: label(pool) }),
      pool.displayName ? el("span", { className: "muted id", text: pool.id }) : null),
    el("p", { className: "facts", text: facts }),
    el("div", { className: "bars" },
      el("section", { className: "quotas" },
        el("h4", { text: "quota used / max" }),
        ...(quotaBars.length ? quotaBars : [el("p", { className: "muted", text: "no quota rows" })])),
      el("section", { className: "capacity" },
        el("h4", { text: "capacity booked / allocatable" }), ...capacity)));
}

function showValue(value) {
  if (value === null || value === undefined) return "none";
  return typeof value === "string" ? value : JSON.stringify(value);
}

function renderFeedEntry(event) {
  const pool = state.pools.get(event.poolId);
  const data = event.data || {};
  const changes = (data.changes || []).map((c) => el("li",
    { className: "change", "data-path": c.path },
    el("code", { text: c.path }), " ",
    el("span", { className: "before", text: showValue(c.before) }), " \u2192 ",
    el("span", { className: "after", text: showValue(c.after) })));
  if (event.type === "pool.usage") {
    for (const q of data.quotas || []) {
      changes.push(el("li", { className: "usage" },
        `${q.tenantId} · ${q.resource}: ${q.used} / ${amount(q.max)} used`));
    }
    for (const c of data.capacity || []) {
      changes.push(el("li", { className: "usage" },
        `capacity ${c.resource}: ${c.booked} booked, ${c.available} available`));
    }
  }
  const when = event.occurredAt ? new Date(event.occurredAt).toLocaleTimeString() : "";
  return el("li", { className: "event", "data-type": event.type, "data-pool-id": event.poolId,
                    "data-cursor": event.cursor },
    el("div", { className: "head" },
      el("time", { text: when, dateTime: event.occurredAt || "" }), " ",
      el("strong", { text: event.type }), " ",
      el("span", { text: pool ? label(pool) : event.poolId }),
      event.tenantId ? el("span", { className: "muted", text: ` by ${event.tenantId}` }) : null),
    changes.length ? el("ul", { className: "changes" }, ...changes) : null);
}

function renderLending() {
  const section = $("lending");
  const owned = [...state.pools.values()].some((p) => p.owned);
  section.hidden = !owned && !state.lending.length && !state.lendingNote;
  $("lending-note").textContent = state.lendingNote
    || (state.lending.length ? "" : "Nothing of this tenant's is lent.");
  $("lending").querySelector("tbody").replaceChildren(...state.lending.map((row) => {
    const pool = state.pools.get(row.poolId);
    const holders = pool ? [...pool.quotas.values()]
      .filter((q) => q.resource === row.resource && q.tenantId !== pool.tenantId)
      .map((q) => `${q.tenantId} ${q.used} / ${amount(q.max)}`).join(", ") : "";
    const cells = [pool ? label(pool) : row.poolId, row.resource, row.offered, row.guestUsed,
      row.booked, row.allocatable,
      row.overcommit === null ? "none" : `${Math.round(row.overcommit * 100)}%`, holders || "none"];
    return el("tr", { "data-pool-id": row.poolId, "data-resource": row.resource,
                      "data-offered": row.offered, "data-guest-used": row.guestUsed,
                      "data-booked": row.booked, "data-allocatable": row.allocatable,
                      "data-overcommit": row.overcommit ?? "" },
      ...cells.map((value) => el("td", { text: String(value) })));
  }));
}

function render() {
  const pools = [...state.pools.values()];
  $("empty").hidden = !(state.loaded && pools.length === 0);
  $("empty-tenant").textContent = state.tenant;
  $("pools").replaceChildren(...pools.map(renderPool));
  $("feed").replaceChildren(...state.feed.map(renderFeedEntry));
  $("feed-empty").hidden = state.feed.length > 0 || !state.token;
  renderLending();
  $("cursor").textContent = state.cursor ? `last cursor ${state.cursor}` : "";
  $("pools").dataset.loaded = String(state.loaded); // the state was read: for tests and CSS
}

// ---- the page ---------------------------------------------------------------------------

// The token and tenant last shown, kept for this tab only (sessionStorage): a reload
// shows the same pools again; closing the tab forgets the token.
const REMEMBERED = "bettercompute.console";

$("connect").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  const tenant = $("tenant").value.trim();
  sessionStorage.setItem(REMEMBERED, JSON.stringify({ token, tenant }));
  show(token, tenant);
});

try {
  const remembered = JSON.parse(sessionStorage.getItem(REMEMBERED) || "null");
  if (remembered && remembered.token && remembered.tenant) {
    $("token").value = remembered.token;
    $("tenant").value = remembered.tenant;
    show(remembered.token, remembered.tenant);
  }
} catch (error) {
  sessionStorage.removeItem(REMEMBERED);
}
$("pause").addEventListener("click", pause);

// For people debugging a stream and for the browser test: the function events go
// through, the state it keeps, and the open socket.
window.bcConsole = {
  applyEvent,
  state,
  socket: () => state.socket,
};
