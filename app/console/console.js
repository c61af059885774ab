// The live console: the tenant's pools as a table, refreshed on every poolEvents event
// over graphql-transport-ws; on a lost connection it reconnects and resumes after the
// last cursor it saw. No dependencies, no build step.
"use strict";

const POOLS = `query Pools($t: String!) { pools(tenantId: $t, first: 100) { nodes {
  id class gpuModel region owned version
  quotas { resource used max }
  capacity { resource total booked available } } } }`;
const EVENTS = `subscription Events($t: String!, $after: String) {
  poolEvents(tenantId: $t, after: $after) { cursor type poolId } }`;
const UNLIMITED = 2147483647; // an owner's quota rows: no limit but capacity

const $ = (id) => document.getElementById(id);
let session = 0; // a new "Show pools" ends the previous session's socket

function setStatus(state) {
  $("status").dataset.state = state;
  $("status").textContent = state;
}

async function loadPools(token, tenant) {
  const response = await fetch("/graphql", {
    method: "POST",
    headers: { "content-type": "application/json", accept: "application/graphql-response+json",
               authorization: `Bearer ${token}` },
    body: JSON.stringify({ query: POOLS, variables: { t: tenant } }),
  });
  const body = await response.json();
  if (!body.data) throw new Error(body.errors.map((e) => e.message).join("; "));
  render(body.data.pools.nodes);
}

function rows(items, cell) {
  return (items || []).map(cell).join(", ");
}

function render(pools) {
  const tbody = $("pools").querySelector("tbody");
  tbody.replaceChildren(...pools.map((p) => {
    const tr = document.createElement("tr");
    tr.dataset.poolId = p.id;
    const cells = [p.id, p.class, p.gpuModel ?? "", p.region, p.owned ? "yes" : "no", p.version,
      rows(p.quotas, (q) => `${q.resource} ${q.used} / ${q.max === UNLIMITED ? "unlimited" : q.max}`),
      p.capacity === null ? "n/a" : rows(p.capacity, (c) => `${c.resource} ${c.booked} / ${c.total}`)];
    for (const value of cells) {
      const td = document.createElement("td");
      td.textContent = String(value);
      tr.append(td);
    }
    return tr;
  }));
  $("pools").hidden = false;
}

function follow(token, tenant, mine) {
  let cursor = null;
  let delay = 500;
  const open = () => {
    if (mine !== session) return;
    setStatus("connecting");
    const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/graphql`;
    const ws = new WebSocket(url, "graphql-transport-ws");
    ws.onopen = () => ws.send(JSON.stringify(
      { type: "connection_init", payload: { authorization: `Bearer ${token}` } }));
    ws.onmessage = async (message) => {
      if (mine !== session) { ws.close(); return; }
      const msg = JSON.parse(message.data);
      if (msg.type === "connection_ack") {
        setStatus("live");
        delay = 500;
        ws.send(JSON.stringify({ id: "1", type: "subscribe",
          payload: { query: EVENTS, variables: { t: tenant, after: cursor } } }));
        await loadPools(token, tenant).catch(showError); // what changed while away
      } else if (msg.type === "ping") {
        ws.send(JSON.stringify({ type: "pong" }));
      } else if (msg.type === "next") {
        if (msg.payload.errors) { showError(new Error(msg.payload.errors[0].message)); return; }
        cursor = msg.payload.data.poolEvents.cursor;
        await loadPools(token, tenant).catch(showError);
      }
    };
    ws.onclose = (event) => {
      if (mine !== session) return;
      setStatus("offline");
      if (event.code === 4403) { showError(new Error("the token was refused")); return; }
      setTimeout(open, delay);
      delay = Math.min(delay * 2, 10000);
    };
  };
  open();
}

function showError(error) {
  $("error").textContent = error.message;
}

$("connect").addEventListener("submit", async (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  const tenant = $("tenant").value.trim();
  const mine = ++session;
  $("error").textContent = "";
  try {
    await loadPools(token, tenant);
  } catch (error) {
    showError(error);
    return;
  }
  follow(token, tenant, mine);
});
