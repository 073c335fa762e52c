// edgefleet dashboard: vanilla JS, no build step, nothing from elsewhere.
// Everything an agent supplies (ids, sites, model names, reasons) is hostile text: it is
// only ever placed with textContent or as an attribute value via setAttribute, never
// parsed as HTML. The admin token never stays in the page: sign-in exchanges it for an
// HttpOnly session cookie.
"use strict";

const ROLES = { viewer: 1, operator: 2, admin: 3 };
const PAGE = 50;
const state = {
  role: null,
  agents: new Map(),      // agent_id -> agent JSON (GET /v1/agents shape)
  sortKey: "agent_id",
  sortDir: 1,
  page: 0,
  filterText: "",
  filterStatus: "",
  visible: [],            // ids on the current page, in order
  rows: new Map(),        // agent_id -> <tr> of the current page
  points: [],             // fleet series points (oldest first)
  current: null,
  events: null,
  latencies: [],          // report receive -> row painted, ms (read by tests)
  serverDelays: [],       // report receive -> event sent by the coordinator, ms
  detailId: null,
  rolloutId: null,        // the rollout shown in detail (#rollouts/<id>)
  rolloutsActive: false,  // a rollout is running or paused: the view refreshes itself
};
window.edgefleet = state;

const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function setStatus(text) { $("status-line").textContent = text; }

async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  let data = null;
  const type = response.headers.get("Content-Type") || "";
  if (type.includes("json")) data = await response.json();
  if (response.status === 401 && state.role && path !== "/v1/dashboard/session") sessionEnded();
  if (!response.ok) {
    const message = data && data.error ? data.error.message : response.statusText;
    const error = new Error(message);
    error.status = response.status;
    error.code = data && data.error ? data.error.code : null;
    throw error;
  }
  return data;
}

// Sessions are kept in the coordinator's database (a restart keeps them): a sign-out, the
// admin token's revocation (or a new bootstrap token) or the session's expiry ends one.
// The next refused request brings the sign-in form back (and drops what the page held),
// rather than a page of stale data and failing buttons.
function sessionEnded() {
  state.role = null;
  if (state.events) { state.events.close(); state.events = null; }
  state.agents = new Map();
  state.points = [];
  $("agent-rows").replaceChildren();
  if (fleetMap) fleetMap.clear();
  $("nav").hidden = true;
  $("sign-out").hidden = true;
  $("who").textContent = "";
  route();
  setStatus("Your session has ended (signed out, expired, its token revoked or replaced): sign in again.");
}

// ------------------------------------------------------------------ agents

function agentStatus(a) {
  if (a.liveness === "down") return "down";
  if (a.draining || (a.load && a.load.draining)) return "draining";
  if (a.liveness === "live") return "live";
  return "suspect";
}

function reportAgeS(a) {
  if (!a.last_seen) return Infinity;
  return Math.max(0, (Date.now() - Date.parse(a.last_seen)) / 1000);
}

function sortValue(a, key) {
  const load = a.load || {};
  switch (key) {
    case "status": return agentStatus(a);
    case "queue": return load.waiting_sequences || 0;
    case "running": return load.running_sequences || 0;
    case "tps": return load.tokens_per_second || 0;
    case "kv": return load.kv_cache_used_fraction || 0;
    case "age": return reportAgeS(a);
    case "site": return a.site || "";
    case "coordinator": return a.coordinator || "";
    default: return a.agent_id;
  }
}

// bytes as MiB for people ("512 MiB")
function mib(bytes) {
  return `${Math.round((Number(bytes) || 0) / 1048576)} MiB`;
}

function modelsText(a) {
  const inventory = a.load && a.load.inventory;
  if (inventory && inventory.length) {
    // /v1/agents gives each inventory entry as an object (name, version, state, ...)
    return inventory
      .filter((m) => (m.state ?? "loaded") === "loaded")
      .map((m) => `${m.name ?? m[0]}@${m.version ?? m[1]}`)
      .join(", ");
  }
  return (a.models || []).map((m) => (m.version ? `${m.name}@${m.version}` : m.name)).join(", ");
}

function matches(a, text) {
  if (state.filterStatus && agentStatus(a) !== state.filterStatus) return false;
  return !text || a.agent_id.toLowerCase().includes(text) || (a.site || "").toLowerCase().includes(text)
    || modelsText(a).toLowerCase().includes(text);
}

function countShown() {
  const text = state.filterText.toLowerCase();
  let n = 0;
  for (const a of state.agents.values()) if (matches(a, text)) n += 1;
  return n;
}

function filtered() {
  const text = state.filterText.toLowerCase();
  const out = [];
  for (const a of state.agents.values()) if (matches(a, text)) out.push(a);
  const key = state.sortKey, dir = state.sortDir;
  out.sort((x, y) => {
    const p = sortValue(x, key), q = sortValue(y, key);
    if (p < q) return -dir;
    if (p > q) return dir;
    return x.agent_id < y.agent_id ? -1 : 1;
  });
  return out;
}

// A comma-separated list as one line per item; an item wraps only after an "@" (between a
// model's name and its version), never inside a name. Rebuilt only when the text changed.
function fillList(cell, text) {
  if (cell.dataset.text === text) return;
  cell.dataset.text = text;
  const items = text ? text.split(", ") : [];
  cell.replaceChildren(...items.map((item, i) => {
    const line = el("span", null, "item");
    const parts = (i < items.length - 1 ? `${item},` : item).split("@");
    parts.forEach((part, j) => {
      if (j > 0) line.appendChild(document.createElement("wbr"));
      line.appendChild(el("span", j < parts.length - 1 ? `${part}@` : part, "word"));
    });
    return line;
  }));
}

function fillRow(tr, a) {
  const load = a.load || {};
  const status = agentStatus(a);
  const cells = tr.children;
  cells[0].firstChild.textContent = a.agent_id;
  cells[1].textContent = a.site || "";
  cells[1].title = a.site || "";
  cells[2].textContent = status;
  cells[2].className = `status ${status}`;
  const numbers = [
    load.waiting_sequences ?? "",
    load.running_sequences ?? "",
    load.tokens_per_second !== undefined ? load.tokens_per_second.toFixed(1) : "",
    load.kv_cache_used_fraction !== undefined ? `${Math.round(load.kv_cache_used_fraction * 100)}%` : "",
  ];
  numbers.forEach((value, i) => {
    // a down agent's last report is history, not its load now: shown on hover only
    const stale = status === "down" && value !== "";
    cells[3 + i].textContent = stale ? "-" : String(value);
    cells[3 + i].title = stale ? `last report: ${value}` : "";
  });
  fillList(cells[7], modelsText(a));
  const age = reportAgeS(a);
  cells[8].textContent = Number.isFinite(age) ? `${age.toFixed(0)} s` : "never";
  fillList(cells[9], ((a.hardware && a.hardware.execution_providers) || []).join(", "));
  // the coordinator its session is on (several coordinators share one fleet)
  cells[10].textContent = a.coordinator || "";
  cells[10].title = a.coordinator || "";
}

function newRow(a) {
  const tr = document.createElement("tr");
  const first = document.createElement("td");
  const link = document.createElement("a");
  link.setAttribute("href", `#agent/${encodeURIComponent(a.agent_id)}`);
  first.appendChild(link);
  tr.appendChild(first);
  for (let i = 1; i < 11; i++) tr.appendChild(document.createElement("td"));
  tr.addEventListener("click", (event) => {
    if (event.target.tagName !== "A") location.hash = `#agent/${encodeURIComponent(a.agent_id)}`;
  });
  fillRow(tr, a);
  return tr;
}

function renderTable() {
  const list = filtered();
  const pages = Math.max(1, Math.ceil(list.length / PAGE));
  state.page = Math.min(state.page, pages - 1);
  const slice = list.slice(state.page * PAGE, (state.page + 1) * PAGE);
  const body = $("agent-rows");
  const fragment = document.createDocumentFragment();
  state.rows = new Map();
  state.visible = slice.map((a) => a.agent_id);
  for (const a of slice) {
    const tr = newRow(a);
    state.rows.set(a.agent_id, tr);
    fragment.appendChild(tr);
  }
  body.replaceChildren(fragment);
  $("page-info").textContent = `Page ${state.page + 1} of ${pages}`;
  $("agent-count").textContent = `${list.length} of ${state.agents.size} agents`;
  $("page-prev").disabled = state.page === 0;
  $("page-next").disabled = state.page >= pages - 1;
  for (const button of document.querySelectorAll("th button[data-sort]")) {
    const th = button.parentElement;
    if (button.dataset.sort === state.sortKey) {
      th.setAttribute("aria-sort", state.sortDir > 0 ? "ascending" : "descending");
    } else th.removeAttribute("aria-sort");
  }
}

// The map (map.js): made in init(), fed every agent; redrawn once a frame at most, and
// only when an agent's place, status or site changed.
let fleetMap = null;
const ATLAS = "/dashboard/vendor/countries-110m.json";

function renderMap() {
  for (const a of state.agents.values()) fleetMap.set(a);
  fleetMap.render();
}

async function loadAgents() {
  const all = new Map();
  let after = "";
  for (;;) {
    const page = await api("GET", `/v1/agents?limit=1000${after ? `&after=${encodeURIComponent(after)}` : ""}`);
    for (const a of page.data) all.set(a.agent_id, a);
    if (!page.has_more) break;
    after = page.last_id;
  }
  state.agents = all;
}

// Totals and the count walk every agent: at most once per frame, not once per event.
let summaryPending = false;
function scheduleSummary() {
  if (summaryPending) return;
  summaryPending = true;
  requestAnimationFrame(() => {
    summaryPending = false;
    $("agent-count").textContent = `${countShown()} of ${state.agents.size} agents`;
    renderTotals();
  });
}

function applyAgentRows(message) {
  const painted = [];
  let reorder = false;
  for (const a of message.agents) {
    if (a.removed) {
      state.agents.delete(a.agent_id);
      fleetMap.remove(a.agent_id);
      reorder = true;
      continue;
    }
    const known = state.agents.has(a.agent_id);
    state.agents.set(a.agent_id, a);
    if (fleetMap.set(a)) fleetMap.schedule();
    const tr = state.rows.get(a.agent_id);
    if (tr) {
      fillRow(tr, a);
      painted.push(a.received_ms);
    } else if (!known) reorder = true;
    if (state.detailId === a.agent_id) renderDetail(a);
  }
  if (reorder && currentView() === "fleet") renderTable();
  else scheduleSummary();
  if (painted.length) {
    // After the next paint: the rows are on screen.
    requestAnimationFrame(() => setTimeout(() => {
      const now = performance.timeOrigin + performance.now();
      for (const received of painted) {
        state.latencies.push(now - received);
        state.serverDelays.push(message.sent_ms - received);
      }
      if (state.latencies.length > 100000) { state.latencies.splice(0, 50000); state.serverDelays.splice(0, 50000); }
      performance.mark("edgefleet-live-update");
    }, 0));
  }
}

// ------------------------------------------------------------------ totals and charts

function renderTotals() {
  const counts = { live: 0, suspect: 0, down: 0, draining: 0 };
  let tps = 0, queue = 0;
  for (const a of state.agents.values()) {
    counts[agentStatus(a)] += 1;
    if (a.load && a.liveness !== "down") { tps += a.load.tokens_per_second || 0; queue += a.load.waiting_sequences || 0; }
  }
  const last = state.points.length ? state.points[state.points.length - 1] : null;
  const items = [
    ["Agents live", counts.live], ["Suspect", counts.suspect], ["Down", counts.down],
    ["Draining", counts.draining], ["Tokens/s now", tps.toFixed(1)], ["Queued", queue],
    ["Requests/s (10 s)", last ? last.requests_per_s.toFixed(2) : "-"],
    ["TTFT p99 (10 s)", last && last.ttft_p99_s !== null ? `${(last.ttft_p99_s * 1000).toFixed(0)} ms` : "-"],
  ];
  const box = $("totals");
  if (box.children.length !== items.length) {
    box.replaceChildren(...items.map(([label]) => {
      const div = el("div");
      div.append(el("span", label), el("strong", ""));
      return div;
    }));
  }
  // Only the figures that changed are written (this runs up to once a frame).
  items.forEach(([, value], i) => {
    const strong = box.children[i].lastChild;
    if (strong.textContent !== String(value)) strong.textContent = String(value);
  });
}

// At most this many keyed series per chart (the biggest over the hour; the rest summed).
const MAX_KEYED = 8;
const MAX_KEY_CHARS = 64;

function keyedSeries(field) {
  const totals = new Map();
  for (const p of state.points) {
    const values = p[field];
    if (!values || typeof values !== "object") continue;
    for (const [k, v] of Object.entries(values)) {
      const key = String(k).slice(0, MAX_KEY_CHARS);
      totals.set(key, (totals.get(key) || 0) + (Number(v) || 0));
    }
  }
  const ranked = [...totals.keys()].sort((a, b) => totals.get(b) - totals.get(a) || (a < b ? -1 : 1));
  const kept = ranked.slice(0, MAX_KEYED).sort();
  const rest = new Set(ranked.slice(MAX_KEYED));
  const out = kept.map((k) => [k, state.points.map((p) => Number((p[field] || {})[k]) || 0)]);
  if (rest.size) {
    out.push([`${rest.size} more`, state.points.map((p) => {
      let sum = 0;
      for (const [k, v] of Object.entries(p[field] || {})) if (rest.has(String(k).slice(0, MAX_KEY_CHARS))) sum += Number(v) || 0;
      return sum;
    })]);
  }
  return out;
}

// Chart groups (charts.js) of the fleet metrics, overflow and agent views.
let fleetCharts = null, overflowCharts = null, agentCharts = null;

function renderCharts() {
  const pts = state.points;
  const xs = pts.map((p) => p.t);
  const col = (f, scale = 1) => pts.map((p) => (p[f] === null || p[f] === undefined ? null : p[f] * scale));
  const zero = () => [["none yet", pts.map(() => 0)]];
  if (currentView() === "series") {
    fleetCharts.chart({ id: "chart-requests", title: "Requests per second", unit: "req/s", axis: "requests/s" })
      .update(xs, [["requests", col("requests_per_s")], ["failed", col("failed_per_s")]]);
    fleetCharts.chart({ id: "chart-tokens", title: "Tokens per second", unit: "tok/s", axis: "tokens/s" })
      .update(xs, [["completion", col("tokens_per_s")], ["prompt", col("prompt_tokens_per_s")]]);
    fleetCharts.chart({ id: "chart-ttft", title: "Time to first token (merged histograms)", unit: "ms", axis: "TTFT (ms)" })
      .update(xs, [["p50", col("ttft_p50_s", 1000)], ["p99", col("ttft_p99_s", 1000)]]);
    fleetCharts.chart({ id: "chart-rejections", title: "Rejections per second (rate limits)", unit: "req/s", axis: "rejected/s" })
      .update(xs, [["rejected", col("rejections_per_s")]]);
  } else if (currentView() === "overflow") {
    const overflow = keyedSeries("overflow_per_s");
    const cost = keyedSeries("overflow_cost");
    const redactions = keyedSeries("redactions_per_s");
    overflowCharts.chart({ id: "chart-overflow", title: "Overflow requests per second, by target", unit: "req/s", axis: "requests/s" })
      .update(xs, overflow.length ? overflow : zero());
    overflowCharts.chart({ id: "chart-overflow-cost", title: "Overflow cost per 10 s, by target", unit: "", axis: "cost per 10 s" })
      .update(xs, cost.length ? cost : zero());
    overflowCharts.chart({ id: "chart-redactions", title: "Redactions per second, by type", unit: "values/s", axis: "redacted/s" })
      .update(xs, redactions.length ? redactions : zero());
  }
}

// The agent page's history: GET /v1/admin/agents/{id}/series (the agent's own reports).
async function renderAgentCharts(agentId) {
  let data;
  try { data = await api("GET", `/v1/admin/agents/${encodeURIComponent(agentId)}/series`); }
  catch (error) { $("agent-series-note").textContent = `No history: ${error.message}`; return; }
  if (state.detailId !== agentId) return;
  state.agentSeries = data;
  const pts = data.points;
  const xs = pts.map((p) => p.t);
  const col = (f, scale = 1) => pts.map((p) => (p[f] === null || p[f] === undefined ? null : p[f] * scale));
  $("agent-series-note").textContent = pts.length
    ? `${pts.length} steps of 10 s from this agent's own reports; gaps: no report in that step.`
    : "No closed 10 s step yet: the first appears within 10 s of the agent's first report.";
  agentCharts.chart({ id: "chart-agent-tokens", title: "Tokens per second (completion)", unit: "tok/s", axis: "tokens/s" })
    .update(xs, [["completion", col("tokens_per_s")]]);
  agentCharts.chart({ id: "chart-agent-queue", title: "Queue (waiting, most per step)", unit: "seq", axis: "sequences" })
    .update(xs, [["queue", col("queue")]]);
  agentCharts.chart({ id: "chart-agent-ttft", title: "Time to first token", unit: "ms", axis: "TTFT (ms)" })
    .update(xs, [["p50", col("ttft_p50_s", 1000)], ["p99", col("ttft_p99_s", 1000)]]);
  agentCharts.chart({ id: "chart-agent-errors", title: "Requests and errors per second", unit: "req/s", axis: "requests/s" })
    .update(xs, [["requests", col("requests_per_s")], ["failed", col("failed_per_s")]]);
}

async function loadSeries() {
  const data = await api("GET", "/v1/admin/fleet/series");
  state.points = data.points;
  state.current = data.current;
}

function connectEvents() {
  if (state.events) state.events.close();
  const source = new EventSource("/v1/admin/fleet/events");
  state.events = source;
  source.addEventListener("agents", (event) => applyAgentRows(JSON.parse(event.data)));
  source.addEventListener("point", (event) => {
    state.points.push(JSON.parse(event.data));
    if (state.points.length > 360) state.points.shift();
    if (currentView() === "series" || currentView() === "overflow") renderCharts();
    else if (currentView() === "agent" && state.detailId) renderAgentCharts(state.detailId);
    renderTotals();
  });
  source.addEventListener("ready", () => setStatus("Live updates connected."));
  source.onerror = () => {
    setStatus("Live updates interrupted; reconnecting.");
    // A session ended meanwhile (signed out elsewhere, its token revoked or replaced):
    // whoami says so (401: sessionEnded); a restarted coordinator still knows it.
    api("GET", "/v1/admin/whoami").catch(() => {});
  };
}

// ------------------------------------------------------------------ detail

// LoadReport.semantic_cache_lookups, [outcome, count] pairs since the agent started (issue
// 29): the hit rate is hits over the lookups compared (hit, miss, refused by the guard)
function semanticCacheText(pairs) {
  const n = Object.fromEntries((Array.isArray(pairs) ? pairs : []).slice(0, 8)
    .map((pair) => [String(pair[0]), Number(pair[1]) || 0]));
  const hit = n.hit || 0, miss = n.miss || 0, refused = n.refused || 0;
  const compared = hit + miss + refused;
  if (!compared && !n.ineligible) return "no lookups";
  const rate = compared ? `${(100 * hit / compared).toFixed(1)}% hit rate` : "no hit rate";
  return `${rate} (${hit} hits, ${miss} misses, ${refused} refused by the guard, ` +
    `${n.ineligible || 0} not compared)`;
}

function renderDetail(a) {
  $("agent-h").textContent = `Agent ${a.agent_id}`;
  const load = a.load || {};
  const fields = [
    ["Status", agentStatus(a)], ["Site", a.site || ""],
    ["Location", a.location ? `${a.location.lat}, ${a.location.lon}` : "none"],
    ["URL", a.http_url || ""], ["Agent version", a.agent_version || ""],
    ["Connected since", a.connected_since || "disconnected"], ["Last report", a.last_seen || ""],
    ["Queue", load.waiting_sequences ?? ""], ["Running", load.running_sequences ?? ""],
    ["Tokens/s", load.tokens_per_second !== undefined ? load.tokens_per_second.toFixed(1) : ""],
    ["KV cache", load.kv_cache_used_fraction !== undefined ? `${Math.round(load.kv_cache_used_fraction * 100)}%` : ""],
    // the models' memory budget and what the loaded ones commit of it (0: no budget)
    ["Model memory", load.memory_budget_bytes ? `${mib(load.memory_committed_bytes)} of ${mib(load.memory_budget_bytes)} committed` : ""],
    ["Requests (total / failed)", load.requests_total !== undefined ? `${load.requests_total} / ${load.requests_failed_total}` : ""],
    ["Execution providers", ((a.hardware && a.hardware.execution_providers) || []).join(", ")],
    ["CPUs", a.hardware ? a.hardware.cpu_count : ""], ["Enrolled", a.enrolled ? "yes" : "no"],
    ["Unhealthy", a.unhealthy_reason || "no"],
    // what a stopped agent said as it left (a killed one says nothing)
    ["Goodbye", a.bye_reason || (agentStatus(a) === "down" ? "none: lost without one" : "none")],
    // [type, count] pairs, totals since the agent started (LoadReport.redactions)
    ["Redactions since start", (Array.isArray(load.redactions) ? load.redactions : []).slice(0, 32)
      .map((pair) => `${String(pair[0]).slice(0, 32)}: ${Number(pair[1]) || 0}`).join(", ") || "none"],
    // content safety: the heads it enforces with (none: keys that block are not routed
    // here), and ["category:action", count] pairs since it started (issue 28)
    ["Content safety", load.moderation_heads ? String(load.moderation_heads).slice(0, 128)
      : "none (keys whose policy blocks are not routed here)"],
    ["Moderation flags since start", (Array.isArray(load.moderation_flags) ? load.moderation_flags : []).slice(0, 64)
      .map((pair) => `${String(pair[0]).slice(0, 64)}: ${Number(pair[1]) || 0}`).join(", ") || "none"],
    ["Semantic cache since start", semanticCacheText(load.semantic_cache_lookups)],
  ];
  // a down agent's last report is history, not its load now (as in the fleet table):
  // "-", with the last report's figure on hover
  const down = agentStatus(a) === "down";
  const nowFields = new Set(["Queue", "Running", "Tokens/s", "KV cache"]);
  const nodes = [];
  for (const [k, v] of fields) {
    const stale = down && nowFields.has(k) && v !== "";
    const dd = el("dd", stale ? "-" : v);
    if (stale) dd.title = `last report: ${v}`;
    nodes.push(el("dt", k), dd);
  }
  $("agent-detail").replaceChildren(...nodes);
  const rows = [];
  const inventory = (a.load && a.load.inventory) || [];
  // models it serves but holds out of memory now, [name, expected load seconds] pairs
  const cold = new Map((Array.isArray(load.cold_models) ? load.cold_models : []).slice(0, 64)
    .map((pair) => [String(pair[0]), Number(pair[1]) || 0]));
  // a served model's state: in memory (and how much), or loaded on its next request
  const servedText = (name, resident) => {
    if (cold.has(name)) return `on demand (not in memory; loads in about ${cold.get(name).toFixed(1)} s)`;
    return resident ? `loaded (${mib(resident)} in memory)` : "loaded";
  };
  if (inventory.length) {
    // /v1/agents gives each inventory entry as an object (name, version, state, bytes, self_check)
    for (const m of inventory) {
      const tr = el("tr");
      let stateText = String(m.state ?? "");
      if (m.state === "downloading" && m.bytes_total) stateText += ` (${Math.round((100 * m.bytes_done) / m.bytes_total)} %)`;
      if (m.state === "loaded") stateText = servedText(String(m.name), Number(m.resident_bytes) || 0);
      if (m.last_error) stateText += `: ${m.last_error}`;
      tr.append(el("td", m.name), el("td", m.version), el("td", stateText));
      rows.push(tr);
    }
  } else {
    for (const m of a.models || []) {
      const tr = el("tr");
      tr.append(el("td", m.name), el("td", m.version || ""), el("td", servedText(String(m.name), 0)));
      rows.push(tr);
    }
  }
  $("agent-models").replaceChildren(...rows);
}

async function showAgent(agentId) {
  state.detailId = agentId;
  try {
    const a = await api("GET", `/v1/agents/${encodeURIComponent(agentId)}`);
    state.agents.set(a.agent_id, a);
    renderDetail(a);
  } catch (error) {
    setStatus(`Could not load agent: ${error.message}`);
    return;
  }
  await renderAgentCharts(agentId);
}

async function drainOrResume(kind) {
  const id = state.detailId;
  try {
    const a = await api("POST", `/v1/admin/agents/${encodeURIComponent(id)}/${kind}`);
    state.agents.set(a.agent_id, a);
    renderDetail(a);
    setStatus(`${kind === "drain" ? "Drained" : "Resumed"} ${id}.`);
  } catch (error) {
    setStatus(`Could not ${kind} ${id}: ${error.message}`);
  }
}

// ------------------------------------------------------------------ tokens, keys, audit

function actionButton(text, handler, role) {
  const button = el("button", text);
  button.type = "button";
  if (role) button.dataset.role = role;
  button.addEventListener("click", handler);
  return button;
}

async function showTokens() {
  const data = await api("GET", "/v1/admin/tokens");
  const rows = data.data.map((t) => {
    const tr = el("tr");
    const action = el("td");
    if (t.state === "active") {
      action.appendChild(actionButton("Revoke", async () => {
        try { await api("DELETE", `/v1/admin/tokens/${encodeURIComponent(t.token_id)}`); await showTokens(); }
        catch (error) { setStatus(`Could not revoke: ${error.message}`); }
      }, "admin"));
    }
    tr.append(el("td", t.token_id), el("td", t.site), el("td", t.note), el("td", `${t.uses} / ${t.max_uses}`),
      el("td", t.expires_at || "never"), el("td", t.state), action);
    return tr;
  });
  $("token-rows").replaceChildren(...rows);
  applyRole();
}

async function createToken(event) {
  event.preventDefault();
  const form = event.target;
  const body = { site: form.site.value, note: form.note.value, max_uses: Number(form.max_uses.value),
    expires_in_s: Number(form.expires_in_s.value) };
  if (form.lat.value !== "" || form.lon.value !== "") { body.lat = Number(form.lat.value); body.lon = Number(form.lon.value); }
  try {
    const created = await api("POST", "/v1/admin/tokens", body);
    $("token-secret-value").textContent = created.token;
    $("token-secret").hidden = false;
    await showTokens();
  } catch (error) { setStatus(`Could not create the join token: ${error.message}`); }
}

// a key's keep-alive cap and pin right (issue 26)
function keepAliveText(k) {
  const cap = k.max_keep_alive_s ? `up to ${durationText(k.max_keep_alive_s)}` : "the agent's cap";
  return k.may_pin_models ? `${cap}; may pin` : cap;
}

function durationText(seconds) {
  if (seconds % 3600 === 0) return `${seconds / 3600} h`;
  if (seconds % 60 === 0) return `${seconds / 60} min`;
  return `${seconds} s`;
}

// a key's policy (issues 28 and 29): its moderation rules, stream mode and semantic cache
function policyText(policy) {
  const parts = [];
  const moderation = (policy && policy.moderation) || {};
  for (const direction of ["input", "output"]) {
    for (const [category, rule] of Object.entries(moderation[direction] || {})) {
      const action = typeof rule === "string" ? rule : `${rule.action} at ${rule.threshold}`;
      parts.push(`${direction} ${category}: ${action}`);
    }
  }
  if (moderation.stream_mode && moderation.stream_mode !== "buffered") parts.push(`streams ${moderation.stream_mode}`);
  if (policy && policy.semantic_cache) parts.push("semantic cache");
  return parts.join("; ") || "default";
}

async function showKeys() {
  const data = await api("GET", "/v1/admin/keys");
  const rows = data.data.map((k) => {
    const tr = el("tr");
    const action = el("td");
    if (k.state === "active") {
      action.appendChild(actionButton("Revoke", async () => {
        try { await api("DELETE", `/v1/admin/keys/${encodeURIComponent(k.key_id)}`); await showKeys(); }
        catch (error) { setStatus(`Could not revoke: ${error.message}`); }
      }, "admin"));
    }
    tr.append(el("td", k.key_id), el("td", k.name), el("td", k.models.join(", ") || "all"),
      el("td", keepAliveText(k)), el("td", policyText(k.policy)), el("td", k.state),
      el("td", k.usage.requests), el("td", Number(k.moderation_flags) || 0), action);
    return tr;
  });
  $("key-rows").replaceChildren(...rows);
  applyRole();
}

async function createKey(event) {
  event.preventDefault();
  const form = event.target;
  const models = form.models.value.split(",").map((m) => m.trim()).filter(Boolean);
  try {
    const created = await api("POST", "/v1/admin/keys", { name: form.name.value, models,
      requests_per_minute: Number(form.requests_per_minute.value), allow_cloud: form.allow_cloud.checked });
    $("key-secret-value").textContent = created.secret;
    $("key-secret").hidden = false;
    await showKeys();
  } catch (error) { setStatus(`Could not create the API key: ${error.message}`); }
}

async function showAudit() {
  const data = await api("GET", "/v1/admin/audit?limit=500");
  const rows = data.data.slice().reverse().map((e) => {
    const tr = el("tr");
    tr.append(el("td", e.time || e.at || ""), el("td", e.actor_name || ""), el("td", e.role || ""),
      el("td", e.action || ""), el("td", e.target || ""), el("td", `${e.outcome} (${e.status})`));
    return tr;
  });
  $("audit-rows").replaceChildren(...rows);
}

// Rollouts and the catalog: the admin API's /v1/admin/rollouts and /v1/admin/models
// (coordinator/api/admin.py, coordinator/api/models.py). A coordinator without the
// rollout engine answers 503 rollouts_unavailable, and the view says so (no invented data).

function unavailable(error, what) {
  if (error.status === 503 || error.status === 404) return `This coordinator has no ${what} (${error.code || error.status}).`;
  return `Could not load the ${what}: ${error.message}`;
}

function fmt(value, digits, unit) {
  if (value === null || value === undefined) return "-";
  return `${Number(value).toFixed(digits)}${unit || ""}`;
}

function rolloutActions(r) {
  const act = (verb) => {
    const button = actionButton(verb[0].toUpperCase() + verb.slice(1), async (event) => {
      event.stopPropagation();
      try {
        await api("POST", `/v1/admin/rollouts/${encodeURIComponent(r.rollout_id)}/${verb}`);
        setStatus(`Rollout ${r.rollout_id}: ${verb} done.`);
      } catch (error) { setStatus(`Could not ${verb} the rollout: ${error.message}`); }
      await showRollouts();
    }, "operator");
    button.dataset.action = verb;
    button.setAttribute("aria-label", `${verb} rollout ${r.rollout_id}`);
    return button;
  };
  if (r.state === "running") return [act("pause"), act("abort")];
  if (r.state === "paused") return [act("resume"), act("abort")];
  return [];
}

async function showRollouts() {
  let data;
  try { data = await api("GET", "/v1/admin/rollouts"); }
  catch (error) {
    $("rollouts-note").textContent = unavailable(error, "model rollouts");
    $("rollout-rows").replaceChildren();
    $("rollout-detail").replaceChildren();
    return;
  }
  $("rollouts-note").textContent = `${data.data.length} rollouts (newest first).`;
  state.rolloutsActive = data.data.some((r) => r.state === "running" || r.state === "paused");
  const rows = data.data.map((r) => {
    const tr = el("tr");
    tr.dataset.rollout = r.rollout_id;
    const actions = el("td");
    actions.append(...rolloutActions(r));
    const link = el("a", r.rollout_id);
    link.setAttribute("href", `#rollouts/${encodeURIComponent(r.rollout_id)}`);
    const first = el("td");
    first.appendChild(link);
    tr.append(first, el("td", `${r.model}@${r.version}`), el("td", r.previous_version || "none"),
      el("td", r.state, `rollout-state ${r.state}`),
      el("td", `${r.step_name} (step ${Math.min(r.step + 1, r.steps)} of ${r.steps})`),
      el("td", `${r.moved} / ${r.agents}`), el("td", r.detail || ""), actions);
    tr.addEventListener("click", (event) => {
      if (event.target.tagName !== "A" && event.target.tagName !== "BUTTON") location.hash = `#rollouts/${encodeURIComponent(r.rollout_id)}`;
    });
    return tr;
  });
  $("rollout-rows").replaceChildren(...rows);
  const wanted = state.rolloutId || (data.data.length ? data.data[0].rollout_id : null);
  if (wanted) await showRollout(wanted);
  else $("rollout-detail").replaceChildren();
  applyRole();
}

const GATE_FIGURES = [
  ["verdict", "Verdict", (g) => g.verdict],
  ["requests", "Requests on the new version", (g, t) => `${g.requests} (at least ${t.min_requests})`],
  ["error_rate", "Error rate", (g, t) => `${fmt(g.error_rate === null ? null : g.error_rate * 100, 2, " %")} (${g.failed} failed; at most ${fmt(t.max_error_rate * 100, 2, " %")})`],
  ["ttft_p99_s", "TTFT p99", (g) => `${fmt(g.ttft_p99_s === null ? null : g.ttft_p99_s * 1000, 1, " ms")} (previous version ${fmt(g.baseline_ttft_p99_s === null ? null : g.baseline_ttft_p99_s * 1000, 1, " ms")})`],
  ["ttft_ratio", "TTFT p99 ratio", (g, t) => `${fmt(g.ttft_ratio, 3)} (at most ${fmt(t.max_ttft_p99_ratio, 2)})`],
  ["loaded", "Agents loaded", (g) => `${g.loaded} of ${g.agents}`],
  ["soak", "Soak", (g) => `${fmt(g.soak_elapsed_s, 1, " s")} of ${fmt(g.soak_s, 0, " s")}`],
];

async function showRollout(rolloutId) {
  let r;
  try { r = await api("GET", `/v1/admin/rollouts/${encodeURIComponent(rolloutId)}`); }
  catch (error) { $("rollout-detail").replaceChildren(el("p", `Could not load rollout ${rolloutId}: ${error.message}`, "error")); return; }
  const box = $("rollout-detail");
  const nodes = [el("h3", `Rollout ${r.rollout_id}: ${r.model} ${r.previous_version || "(none)"} to ${r.version}`)];
  const facts = el("dl", null, "rollout-facts");
  facts.append(el("dt", "State"), el("dd", r.state, `rollout-state ${r.state}`),
    el("dt", "Step"), el("dd", `${r.step_name} (step ${Math.min(r.step + 1, r.steps)} of ${r.steps})`),
    el("dt", "Agents moved"), el("dd", `${r.moved} of ${r.agents}`),
    el("dt", "Started by"), el("dd", r.created_by || ""),
    el("dt", "Detail"), el("dd", r.detail || ""));
  nodes.push(facts);
  const actions = el("div", null, "actions");
  actions.append(...rolloutActions(r));
  nodes.push(actions);
  nodes.push(el("h4", "Waves"));
  const waves = el("ol", null, "waves");
  const finished = r.state === "completed";
  (r.plan || []).forEach((agents, index) => {
    const moved = index < r.step || (index === r.step && r.step_started_at !== null);
    const status = finished || index < r.step ? "passed"
      : index === r.step ? (r.state === "running" || r.state === "paused" ? `${r.state}, ${moved ? "moved" : "not moved yet"}` : r.state)
      : "waiting";
    const li = el("li", `${index === 0 ? "canary" : `wave ${index}`}: ${agents.length} agents, ${status}`);
    li.dataset.wave = String(index);
    waves.appendChild(li);
  });
  nodes.push(waves);
  const gate = r.gate || r.last_gate;
  if (gate) {
    const thresholds = r.policy || {};
    nodes.push(el("h4", r.gate ? "Gate of the current step, now" : "Last gate"));
    const dl = el("dl", null, "gate");
    for (const [key, label, show] of GATE_FIGURES) {
      const dd = el("dd", show(gate, thresholds));
      dd.dataset.gate = key;
      dl.append(el("dt", label), dd);
    }
    const reasons = gate.reasons || [];
    const dd = el("dd", reasons.length ? reasons.join("; ") : "none");
    dd.dataset.gate = "reasons";
    dl.append(el("dt", "Waiting for / failed on"), dd);
    nodes.push(dl);
  } else nodes.push(el("p", "No gate: the rollout is over.", "hint"));
  box.replaceChildren(...nodes);
  box.dataset.rollout = r.rollout_id;
  applyRole();
}


// a deploy rule's residency (issue 26), as an operator reads it
const RESIDENCY_TEXT = { on_demand: "on demand", pinned: "pinned in memory", store_only: "on disk, not served" };

async function showModels() {
  let data;
  try { data = await api("GET", "/v1/admin/models"); }
  catch (error) {
    $("models-note").textContent = unavailable(error, "model catalog");
    $("model-rows").replaceChildren();
    $("model-rules").replaceChildren();
    return;
  }
  $("models-note").textContent = `${data.data.length} model versions. Manifests are signed with the coordinator's key ${data.signing_public_key || ""}.`;
  const rows = data.data.map((m) => {
    const tr = el("tr");
    tr.dataset.model = `${m.name}@${m.version}`;
    tr.append(el("td", m.name), el("td", m.version), el("td", m.task || ""),
      el("td", `${(m.size_bytes / 1e6).toFixed(1)} MB`), el("td", m.gate_passed ? "passed" : "failed"),
      el("td", m.deprecated ? "yes" : "no"), el("td", m.desired_by), el("td", m.loaded_on),
      el("td", m.published_at || ""), el("td", m.held_by ?? ""));
    return tr;
  });
  $("model-rows").replaceChildren(...rows);
  const rules = (data.rules || []).map((rule) => {
    const tr = el("tr");
    const sel = rule.selector || {};
    const where = [...(sel.sites || []).map((x) => `site ${x}`), ...(sel.labels || []).map((x) => `label ${x}`),
      ...(sel.agent_ids || []).map((x) => `agent ${x}`)].join(", ") || "every agent";
    tr.append(el("td", rule.name), el("td", rule.version), el("td", where),
      el("td", RESIDENCY_TEXT[rule.residency] || rule.residency || "on demand"), el("td", rule.rollout_id || ""),
      el("td", rule.set_at || ""));
    return tr;
  });
  $("model-rules").replaceChildren(...rules);
}

// ------------------------------------------------------------------ navigation, roles

const VIEWS = ["signin", "fleet", "agent", "series", "tokens", "keys", "rollouts", "models", "overflow", "audit"];

function currentView() {
  const hash = location.hash.replace(/^#/, "");
  if (!state.role) return "signin";
  if (hash.startsWith("agent/")) return "agent";
  if (hash.startsWith("rollouts/")) return "rollouts";
  return VIEWS.includes(hash) && hash !== "signin" ? hash : "fleet";
}

function applyRole() {
  const level = ROLES[state.role] || 0;
  for (const node of document.querySelectorAll("[data-role]")) {
    node.hidden = level < ROLES[node.dataset.role];
  }
}

async function route() {
  const view = currentView();
  for (const name of VIEWS) $(`view-${name}`).hidden = name !== view;
  for (const link of document.querySelectorAll("nav a")) {
    if (link.getAttribute("href") === `#${view}`) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (view !== "agent") state.detailId = null;
  const hash = location.hash.replace(/^#/, "");
  state.rolloutId = hash.startsWith("rollouts/") ? decodeURIComponent(hash.slice("rollouts/".length)) : null;
  try {
    if (view === "fleet") renderTable();
    else if (view === "agent") await showAgent(decodeURIComponent(location.hash.slice("#agent/".length)));
    else if (view === "series" || view === "overflow") renderCharts();
    else if (view === "tokens") await showTokens();
    else if (view === "keys") await showKeys();
    else if (view === "rollouts") await showRollouts();
    else if (view === "models") await showModels();
    else if (view === "audit") await showAudit();
  } catch (error) { setStatus(`Could not load the view: ${error.message}`); }
  applyRole();
}

async function start() {
  let me;
  // The fleet and the series are asked for at once with whoami (one round trip, not two);
  // signed out, they are refused like it and nothing is shown.
  // (index.html preloads both: they are on the way while the scripts load.)
  const data = Promise.all([loadAgents(), loadSeries()]);
  data.catch(() => {});
  try { me = await api("GET", "/v1/admin/whoami"); }
  catch (error) {
    state.role = null;
    $("nav").hidden = true;
    $("sign-out").hidden = true;
    $("who").textContent = "";
    await route();
    if (error.status !== 401) setStatus(`Could not reach the coordinator: ${error.message}`);
    return;
  }
  state.role = me.role;
  $("who").textContent = `Signed in as ${me.name} (${me.role})`;
  $("nav").hidden = false;
  $("sign-out").hidden = false;
  setStatus("Loading the fleet.");
  // The land arrives with the fleet and is drawn right after it: the agents first.
  const atlas = fleetMap.atlas === "loaded" ? null : fleetMap.fetchAtlas(ATLAS);
  await data;
  renderMap();
  renderTotals();
  await route();
  requestAnimationFrame(() => setTimeout(() => {
    performance.mark("edgefleet-first-render");
    setStatus(`${state.agents.size} agents.`);
    if (atlas) atlas.then((topology) => fleetMap.drawAtlas(topology));
  }, 0));
  connectEvents();
}

// The fleet database's health (GET /healthz, public), in the header: its backend and
// round trip, or since when it is unavailable and how many writes wait for it.
async function showStoreHealth() {
  const element = $("store-health");
  let store, coordinator;
  try {
    const response = await fetch("/healthz", { credentials: "same-origin" });
    ({ store, coordinator } = await response.json());
  } catch (error) {
    return;  // the coordinator itself is unreachable: the events stream says so
  }
  if (coordinator) showCoordinators(coordinator);
  if (!store) return;
  const backend = store.backend === "postgresql" ? "PostgreSQL" : "SQLite";
  element.dataset.status = store.status;
  if (store.status === "ok") {
    const latency = store.latency_ms === null ? "" : `, ${store.latency_ms.toFixed(1)} ms`;
    const pending = store.pending_writes ? `, ${store.pending_writes} writes catching up` : "";
    element.textContent = `Database (${backend}): ok${latency}${pending}`;
    element.title = store.last_error ? `last error ${store.last_error_at}: ${store.last_error}` : "";
  } else {
    const since = store.down_since ? ` since ${new Date(store.down_since).toLocaleTimeString()}` : "";
    element.textContent = `Database (${backend}) unavailable${since}: ${store.pending_writes} writes kept; agents and routing carry on`;
    element.title = store.last_error || "";
  }
}

// The coordinators sharing the database (/healthz's coordinator object): how many are
// alive and which one leads (this one, another, or none while a lease changes hands).
function showCoordinators(coordinator) {
  const element = $("coordinator-health");
  const alive = coordinator.members_alive;
  let leader;
  if (coordinator.is_leader) leader = "this one leads";
  else if (coordinator.leader) leader = `leader ${coordinator.leader}`;
  else leader = "no leader now";
  const feed = coordinator.change_feed && !coordinator.change_feed.ok ? "; change feed failing" : "";
  element.dataset.status = coordinator.leader || coordinator.is_leader ? "ok" : "degraded";
  element.textContent = `Coordinators: ${alive} alive, ${leader}${feed}`;
  element.title = `this coordinator: ${coordinator.id}, lease epoch ${coordinator.lease_epoch}`;
}

function init() {
  showStoreHealth();
  setInterval(() => { if (!document.hidden) showStoreHealth(); }, 2000);
  fleetMap = new FleetMap($("map"), {
    statusOf: agentStatus,
    onOpen: (id) => { location.hash = `#agent/${encodeURIComponent(id)}`; },
  });
  state.map = fleetMap;
  fleetCharts = new ChartGroup($("charts"));
  overflowCharts = new ChartGroup($("overflow-charts"));
  agentCharts = new ChartGroup($("agent-charts"));
  state.charts = { fleet: fleetCharts, overflow: overflowCharts, agent: agentCharts };
  let resizing = false;
  window.addEventListener("resize", () => {
    if (resizing) return;
    resizing = true;
    requestAnimationFrame(() => { resizing = false; for (const g of [fleetCharts, overflowCharts, agentCharts]) g.resize(); });
  });
  $("signin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const input = $("signin-token");
    try {
      await api("POST", "/v1/dashboard/session", { token: input.value });
      input.value = "";
      $("signin-error").textContent = "";
      if (location.hash === "#signin") location.hash = "#fleet";
      await start();
    } catch (error) {
      input.value = "";
      $("signin-error").textContent = error.message;
    }
  });
  $("sign-out").addEventListener("click", async () => {
    await api("DELETE", "/v1/dashboard/session");
    if (state.events) state.events.close();
    state.agents = new Map();
    location.reload();
  });
  $("filter-text").addEventListener("input", (event) => { state.filterText = event.target.value; state.page = 0; renderTable(); });
  $("filter-status").addEventListener("change", (event) => { state.filterStatus = event.target.value; state.page = 0; renderTable(); });
  $("page-prev").addEventListener("click", () => { state.page -= 1; renderTable(); });
  $("page-next").addEventListener("click", () => { state.page += 1; renderTable(); });
  for (const button of document.querySelectorAll("th button[data-sort]")) {
    button.addEventListener("click", () => {
      const key = button.dataset.sort;
      state.sortDir = state.sortKey === key ? -state.sortDir : 1;
      state.sortKey = key;
      renderTable();
    });
  }
  $("agent-drain").addEventListener("click", () => drainOrResume("drain"));
  $("agent-resume").addEventListener("click", () => drainOrResume("resume"));
  $("token-form").addEventListener("submit", createToken);
  $("key-form").addEventListener("submit", createKey);
  window.addEventListener("hashchange", route);
  // Report ages tick without new data.
  setInterval(() => {
    for (const id of state.visible) {
      const tr = state.rows.get(id), a = state.agents.get(id);
      if (tr && a) { const age = reportAgeS(a); tr.children[8].textContent = Number.isFinite(age) ? `${age.toFixed(0)} s` : "never"; }
    }
  }, 1000);
  // The rollouts view follows progress (steps, gate figures) while it is open.
  setInterval(() => {
    if (currentView() === "rollouts" && state.rolloutsActive && !document.hidden) showRollouts().catch(() => {});
  }, 2000);
  start();
}

document.addEventListener("DOMContentLoaded", init);
