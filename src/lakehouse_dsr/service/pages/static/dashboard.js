// The operator dashboard: the operator token lives in this tab's sessionStorage only; every call carries
// it as a bearer token, and a 401 forgets it and asks again. Charts are SVG built here (the content
// security policy allows no inline style, so colours come from classes in app.css).
import { api, daysText, h, hide, NetworkError, problem, REGULATIONS, show, svg, TYPES, when } from "./common.js";

const $ = (id) => document.getElementById(id);
const TOKEN = "dsr-operator-token";
// The order a run goes through its stages; stages not listed follow, by name.
const STAGE_ORDER = ["ledger", "resolve", "erase", "shred", "propagate", "share", "purge", "verify", "export"];
const PALETTE = 8; // .stage-0 ... .stage-7 in app.css
const WIDTH = 900; // chart coordinates; the SVG scales to the card

class Unauthorized extends Error {}

async function operator(path) {
  const answer = await api(path, { headers: { Authorization: `Bearer ${sessionStorage.getItem(TOKEN)}` } });
  if (answer.status === 401) throw new Unauthorized(problem(answer).message);
  if (answer.status !== 200) throw new Error(problem(answer).message);
  return answer.body;
}

function askToken(message) {
  $("board").hidden = true;
  show($("token-form"));
  if (message) show($("token-error"), message);
  else hide($("token-error"));
  $("token").focus();
}

async function load() {
  if (!sessionStorage.getItem(TOKEN)) return askToken();
  $("reload").disabled = true;
  const sections = [
    ["/api/v1/operator/requests?status=open", (body) => renderOpen(body.requests)],
    ["/api/v1/operator/runs?limit=10", (body) => renderRuns(body.runs)],
    ["/api/v1/operator/tables", (body) => renderTables(body.tables)],
  ];
  const results = await Promise.allSettled(sections.map(([path]) => operator(path)));
  $("reload").disabled = false;
  const refused = results.find((r) => r.status === "rejected" && r.reason instanceof Unauthorized);
  if (refused) {
    sessionStorage.removeItem(TOKEN);
    return askToken(`Wrong token: the service did not accept it (${refused.reason.message}). `
      + "Enter the operator token again.");
  }
  const failures = [];
  results.forEach((result, i) => {
    if (result.status === "fulfilled") sections[i][1](result.value);
    else failures.push(result.reason instanceof NetworkError ? result.reason.message
      : `${sections[i][0].split("?")[0]}: ${result.reason.message}`);
  });
  if (failures.length) show($("board-error"), [...new Set(failures)].join(" "));
  else hide($("board-error"));
  $("token-form").hidden = true;
  show($("board"));
  $("loaded").textContent = `Loaded at ${new Date().toLocaleTimeString()}.`;
}

// -- open requests ---------------------------------------------------------------------------------
function urgency(days) {
  if (days !== null && days < 0) return ["overdue", "Overdue"];
  if (days !== null && days <= 7) return ["soon", "Due soon"];
  return ["later", "Later"];
}

function renderOpen(requests) {
  const rows = [...requests].sort((a, b) =>
    (a.days_left ?? Infinity) - (b.days_left ?? Infinity) || a.received.localeCompare(b.received));
  $("open-count").textContent = `(${rows.length})`;
  $("no-open").hidden = rows.length > 0;
  $("open-requests").hidden = rows.length === 0;
  $("open-requests").tBodies[0].replaceChildren(...rows.map((r) => {
    const [level, label] = urgency(r.days_left);
    return h("tr", { class: `urgency-${level}`, "data-days-left": r.days_left },
      h("td", { class: "urgency-label" }, label),
      h("td", { class: "n" }, r.days_left ?? ""),
      h("td", {}, h("time", { datetime: r.due_date }, r.due_date), r.extended ? " (extended)" : ""),
      h("td", {}, h("code", {}, r.request_id)),
      h("td", { title: TYPES[r.request_type] || "" }, r.request_type),
      h("td", {}, r.regulation.toUpperCase()),
      h("td", { title: r.status_reason || "" }, r.status),
      h("td", {}, when(r.received)));
  }));
}

// -- runs: stacked bars of seconds per stage ---------------------------------------------------------
function stagesOf(runs) {
  const seen = new Set(runs.flatMap((run) => Object.keys(run.seconds || {})));
  const known = STAGE_ORDER.filter((s) => seen.has(s));
  return [...known, ...[...seen].filter((s) => !known.includes(s)).sort()];
}

function niceStep(span) {
  const raw = span / 5;
  const power = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * power).find((step) => step >= raw);
}

/** Horizontal bars, one row per item: `parts(item)` gives [{value, cls, title}] stacked left to right. */
function barChart(items, label, parts, unit, title) {
  const left = 190, right = WIDTH - 80, row = 28, top = 8;
  const totals = items.map((item) => parts(item).reduce((sum, p) => sum + p.value, 0));
  const max = Math.max(...totals, 0) || 1;
  const step = niceStep(max);
  const end = Math.ceil(max / step) * step;
  const x = (value) => left + (value / end) * (right - left);
  const height = top + items.length * row + 28;
  const chart = svg("svg", { class: "chart", viewBox: `0 0 ${WIDTH} ${height}`, role: "img", "aria-label": title });
  for (let tick = 0; tick <= end + step / 2; tick += step) {
    chart.append(svg("line", { class: "axis", x1: x(tick), x2: x(tick), y1: top, y2: height - 22 }),
      svg("text", { x: x(tick), y: height - 6, "text-anchor": "middle" }, `${+tick.toPrecision(6)}${unit}`));
  }
  items.forEach((item, i) => {
    const y = top + i * row + 4;
    const name = label(item);
    const group = svg("g", { class: "bar-row" },
      svg("text", { x: left - 8, y: y + 14, "text-anchor": "end" }, name.length > 28 ? `${name.slice(0, 27)}…` : name,
        svg("title", {}, name)));
    let at = 0;
    for (const part of parts(item)) {
      group.append(svg("rect", { class: part.cls, x: x(at), y, width: Math.max(x(at + part.value) - x(at), 0),
        height: row - 8, "data-value": part.value }, svg("title", {}, part.title)));
      at += part.value;
    }
    group.append(svg("text", { x: x(at) + 6, y: y + 14 }, `${+totals[i].toPrecision(4)}${unit}`));
    chart.append(group);
  });
  return chart;
}

function renderRuns(runs) {
  const stages = stagesOf(runs);
  const cls = (stage) => `stage-${stages.indexOf(stage) % PALETTE}`;
  $("no-runs").hidden = runs.length > 0;
  $("runs-figures").hidden = runs.length === 0;
  $("runs-chart").replaceChildren(runs.length ? barChart(runs, (run) => when(run.started_at),
    (run) => stages.filter((s) => run.seconds[s] !== undefined).map((s) =>
      ({ value: run.seconds[s], cls: cls(s), title: `${s}: ${run.seconds[s].toFixed(1)} s` })),
    " s", `Seconds per stage of the last ${runs.length} runs, newest first`) : "");
  $("stage-legend").replaceChildren(...stages.map((s) => h("li", {}, h("span", { class: `swatch ${cls(s)}` }), s)));
  $("runs-table").tHead.replaceChildren(h("tr", {}, h("th", { scope: "col" }, "Run started"),
    stages.map((s) => h("th", { scope: "col", class: "n" }, `${s} (s)`)),
    ["Total (s)", "Completed", "Failed", "Awaiting purge"].map((t) => h("th", { scope: "col", class: "n" }, t))));
  $("runs-table").tBodies[0].replaceChildren(...runs.map((run) => h("tr", {},
    h("td", { title: run.run_id }, when(run.started_at)),
    stages.map((s) => h("td", { class: "n" }, run.seconds[s] === undefined ? "" : run.seconds[s].toFixed(1))),
    h("td", { class: "n" }, Object.values(run.seconds).reduce((a, b) => a + b, 0).toFixed(1)),
    [run.requests_completed, run.requests_failed, run.requests_erased].map((n) => h("td", { class: "n" }, n ?? "")))));
}

// -- per-table totals --------------------------------------------------------------------------------
function bytes(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) [n, i] = [n / 1024, i + 1];
  return i ? `${n.toFixed(1)} ${units[i]}` : `${n} B`;
}

function renderTables(tables) {
  $("no-tables").hidden = tables.length > 0;
  $("table-totals").hidden = tables.length === 0;
  $("tables-chart").replaceChildren(tables.length ? barChart(tables, (t) => t.table,
    (t) => [{ value: t.rows, cls: "bar", title: `${t.table}: ${t.rows.toLocaleString("en")} rows` }],
    "", "Rows erased or redacted per table over all recorded runs") : "");
  $("table-totals").tBodies[0].replaceChildren(...tables.map((t) => h("tr", {},
    h("td", {}, h("code", {}, t.table)), h("td", { class: "n" }, t.rows.toLocaleString("en")),
    h("td", { class: "n" }, bytes(t.bytes_rewritten)), h("td", { class: "n" }, t.runs))));
}

// -- wiring ------------------------------------------------------------------------------------------
$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  if (!token) return askToken("Enter the operator token.");
  sessionStorage.setItem(TOKEN, token);
  $("token").value = "";
  hide($("token-error"));
  load();
});
$("reload").addEventListener("click", load);
$("forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN);
  askToken();
});
load();
