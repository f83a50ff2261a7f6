// The request timeline web view (collector/web_ui.py): the overview of every request of the window
// (overview.js) and, under it, /api/llm/timeline drawn as one row per request (the window's, or the
// region selected in the overview), the engine lane under it (one band of steps per engine), the load,
// and a trace's waterfall from /api/traces/{id} with the prefills that ran during its decode.
// State is the URL fragment (window, filters, trace, span), so every view is a link.
// Times stay exact in data-* attributes (the API's ns strings; Jaeger's µs integers); only pixel
// positions go through floats, as ms after the window's start.
"use strict";

const WINDOW = ["lookback", "start", "end"];
const FILTERS = ["model", "instance", "finishReason", "ttftAbove", "e2eAbove"];
const PHASES = ["queue", "prefill", "decode"];
const FINISH = ["stop", "length", "abort", "error"];
const TICK_MS = [1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500,
  1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5, 9e5, 18e5, 36e5];
const LEFT = 8, RIGHT = 8, AXIS = 22;
const LANE = 46, LANE_GAP = 16, MAX_STEPS = 3000;  // a lane's height and label; steps drawn one by one up to this
const $ = (id) => document.getElementById(id);

let timeline = null;  // the last /api/llm/timeline data
let base = 0n;        // ns; x positions are ms after it
let full = [0, 1];    // ms: the rows' extent, what "reset zoom" shows
let view = [0, 1];    // ms: what the x axis shows now
let trace = null;     // the open trace (Jaeger JSON)
let loaded = {query: null, trace: null};
let routing = Promise.resolve();  // one route() at a time, in the order the URL changed

function hashParams() { return new URLSearchParams(location.hash.slice(1)); }

function update(changes) {
  const p = hashParams();
  for (const [key, value] of Object.entries(changes)) {
    if (value === null || value === "") p.delete(key); else p.set(key, value);
  }
  location.hash = p.toString();
}

function svg(tag, attrs, parent, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined) node.setAttribute(key, value);
  }
  if (text !== undefined) node.textContent = text;
  parent.append(node);
  return node;
}

function html(tag, parent, text, attrs = {}) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  parent.append(node);
  return node;
}

async function getData(url) {
  const answer = await fetch(url);
  const doc = await answer.json();
  if (!answer.ok) throw new Error(doc.errors ? doc.errors[0].msg : answer.statusText);
  return doc.data;
}

const ms = (ns) => Number(BigInt(ns) - base) / 1e6;
const seconds = (s) => s === null ? "–" : s < 1 ? (s * 1e3).toPrecision(3) + " ms" : s.toPrecision(3) + " s";
const plotWidth = (width) => width - LEFT - RIGHT;

function onUrl() { routing = routing.then(route); }

async function route() {
  const p = hashParams(), query = new URLSearchParams(), windowOnly = new URLSearchParams();
  for (const key of WINDOW) if (p.get(key)) windowOnly.set(key, p.get(key));
  for (const key of [...WINDOW, ...FILTERS]) if (p.get(key)) query.set(key, p.get(key));
  document.body.dataset.state = "loading";
  await routeOverview(p, windowOnly.toString());
  const wanted = regionQuery(p, query.toString());
  if (wanted !== loaded.query) {
    loaded.query = wanted;
    await loadTimeline(loaded.query);
  }
  const traceId = p.get("trace") || "";
  if (traceId !== loaded.trace) {
    loaded.trace = traceId;
    await loadTrace(traceId);
  }
  drawWaterfall(p.get("span"));
  markSelected();
  document.body.dataset.state = "ready";
}

// -- the timeline ---------------------------------------------------------------------------

async function loadTimeline(query) {
  try {
    timeline = await getData("/api/llm/timeline?" + query);
  } catch (err) {
    timeline = null;
    $("status").textContent = "timeline: " + err.message;
    drawTimeline();
    return;
  }
  base = BigInt(timeline.start) * 1000n;
  const rows = timeline.rows;
  full = [0, (timeline.end - timeline.start) / 1e3];
  if (rows.length) {
    const lo = Math.min(...rows.map((r) => ms(r.start_ns))), hi = Math.max(...rows.map((r) => ms(r.end_ns)));
    const pad = Math.max((hi - lo) * 0.02, 1e-3);
    full = [lo - pad, hi + pad];
  }
  view = full.slice();
  showControls();
  drawTimeline();
}

function showControls() {
  const p = hashParams(), facets = {model: timeline.models, instance: timeline.instances,
    finishReason: [...new Set([...FINISH, ...timeline.finishReasons])]};
  for (const input of document.querySelectorAll("#filters [data-param]")) {
    const key = input.dataset.param, value = p.get(key) || "";
    if (input.tagName === "SELECT") {
      input.replaceChildren();
      html("option", input, "any", {value: ""});
      const options = new Set([...facets[key], ...(value ? [value] : [])]);  // keep a value the window lacks
      for (const option of options) html("option", input, option, {value: option});
    }
    input.value = value;
  }
  const shownWindow = overview || timeline;  // the window's bounds, also while a region of it is listed
  $("start").value = localTime(shownWindow.start);
  $("end").value = localTime(shownWindow.end);
  const when = (us) => new Date(us / 1e3).toLocaleString();
  const listed = timeline.truncated ? `${timeline.matched} requests (${timeline.requests} listed: ${timeline.chosen})`
    : `${timeline.requests} requests`;
  const where = p.get("rstart") ? " in the region selected above," : "";
  $("status").textContent = `${timeline.rows.length} shown of ${listed}${where} started ` +
    `${when(timeline.start)} – ${when(timeline.end)}; the load below counts the requests shown`;
}

function localTime(us) {
  const date = new Date(us / 1e3);
  return new Date(date.getTime() - date.getTimezoneOffset() * 6e4).toISOString().slice(0, 23);
}

function drawTimeline() {
  const chart = $("timeline"), width = document.documentElement.clientWidth - 32;
  chart.replaceChildren();
  $("load").replaceChildren();
  if (!timeline) return;
  const rows = timeline.rows, rowHeight = Math.max(3, Math.min(16, Math.floor(520 / Math.max(rows.length, 1))));
  const height = AXIS + rows.length * rowHeight + 4;
  chart.setAttribute("width", width);
  chart.setAttribute("height", height);
  const x = scale(width);
  axis(chart, width, AXIS - 4, height);
  const plot = clipped(chart, "timeline-clip", AXIS, width, height);
  rows.forEach((r, i) => {
    const y = AXIS + i * rowHeight, h = rowHeight - 1, id = r.trace_id;
    const finish = FINISH.includes(r.finish_reason) ? r.finish_reason : r.finish_reason ? "other" : "none";
    const row = svg("g", {"data-kind": "row", "data-trace-id": id, "data-span-id": r.span_id, "data-model": r.model,
      "data-instance": r.instance, "data-finish-reason": r.finish_reason || "", "data-start-ns": r.start_ns,
      "data-end-ns": r.end_ns, class: `row finish-${finish}`}, plot);
    svg("title", {}, row, `${r.name} · trace ${id}\n${r.service} ${r.instance}\nfinish ${r.finish_reason || "–"}, ` +
      `TTFT ${seconds(r.ttft_s)}, e2e ${seconds(r.e2e_s)}, ${r.preemptions_ns.length} preemption(s)`);
    svg("rect", {"data-kind": "request", "data-trace-id": id, "data-start-ns": r.start_ns, "data-end-ns": r.end_ns,
      x: x(r.start_ns), y, width: Math.max(x(r.end_ns) - x(r.start_ns), 1), height: h, class: "request"}, row);
    for (const phase of PHASES) {
      if (!r[phase]) continue;
      const [start, end] = r[phase];
      svg("rect", {"data-kind": phase, "data-trace-id": id, "data-start-ns": start, "data-end-ns": end, x: x(start),
        y: y + 1, width: Math.max(x(end) - x(start), 0.5), height: Math.max(h - 2, 1), class: phase}, row);
    }
    if (r.first_token_ns) {
      const at = x(r.first_token_ns);
      svg("line", {"data-kind": "first_token", "data-trace-id": id, "data-time-ns": r.first_token_ns, x1: at, x2: at,
        y1: y, y2: y + h, class: "first_token"}, row);
    }
    for (const t of r.preemptions_ns) {
      const at = x(t), size = Math.max(3, h / 2);
      svg("path", {"data-kind": "preempted", "data-trace-id": id, "data-time-ns": t,
        d: `M${at - size},${y}H${at + size}L${at},${y + h}Z`, class: "preempted"}, row);
    }
  });
  drawLanes(width);
  drawLoad(width, x);
}

// -- the engine lane ------------------------------------------------------------------------

const xUs = (width) => (us) => LEFT + ((us - timeline.start) / 1e3 - view[0]) / (view[1] - view[0]) * plotWidth(width);
const selectedRow = () => timeline && timeline.rows.find((r) => r.trace_id === hashParams().get("trace"));
const laneOf = (row) => row && timeline.lanes.find((l) => l.instance === row.instance && (!row.model || l.model === row.model));

// The steps a request ran in: its engine's steps that ended from its prefill's start to its decode's end.
function stepsOf(row, lane) {
  if (!row || !lane || !row.prefill) return new Set();
  const from = Number(BigInt(row.prefill[0]) / 1000n), to = Number(BigInt((row.decode || row.prefill)[1]) / 1000n);
  const mine = new Set();
  lane.end_us.forEach((end, i) => { if (end >= from && end <= to) mine.add(i); });
  return mine;
}

function drawLanes(width) {
  const chart = $("lanes"), lanes = timeline.lanes || [];
  chart.replaceChildren();
  chart.setAttribute("width", width);
  chart.setAttribute("height", lanes.length ? lanes.length * (LANE + LANE_GAP) + 4 : 0);
  const x = xUs(width), row = selectedRow(), lo = timeline.start + view[0] * 1e3, hi = timeline.start + view[1] * 1e3;
  lanes.forEach((lane, k) => {
    const top = k * (LANE + LANE_GAP) + LANE_GAP, peak = Math.max(1, ...lane.num_requests);
    const mine = laneOf(row) === lane ? stepsOf(row, lane) : new Set();
    const group = svg("g", {"data-kind": "lane", "data-instance": lane.instance, "data-model": lane.model,
      "data-engine": lane.engine, "data-steps": lane.end_us.length, class: mine.size ? "lane selecting" : "lane"}, chart);
    const title = svg("text", {x: LEFT, y: top - 3, class: "axis-label"}, group, `engine ${lane.engine} of ` +
      `${lane.instance || lane.service} (${lane.model}): its steps, height = requests in the batch (peak ${peak}): `);
    svg("tspan", {class: "prefill"}, title, "\u2588 computed prompt tokens  ");
    svg("tspan", {class: "decode"}, title, "\u2588 decode only");
    svg("line", {x1: LEFT, x2: width - RIGHT, y1: top + LANE, y2: top + LANE, class: "grid"}, group);
    const plot = clipped(group, `lane-clip-${k}`, top, width, top + LANE + 2);
    const visible = [];
    lane.end_us.forEach((end, i) => { if (end >= lo && lane.start_us[i] <= hi) visible.push(i); });
    if (visible.length > MAX_STEPS) {  // too many to draw one by one: one bar per pixel, its tallest step
      const bins = new Map();
      for (const i of visible) {
        const px = Math.floor(x(lane.start_us[i])), bin = bins.get(px) || {batch: 0, prefill: false, mine: false};
        bin.batch = Math.max(bin.batch, lane.num_requests[i]);
        bin.prefill = bin.prefill || lane.prefill_tokens[i] > 0;
        bin.mine = bin.mine || mine.has(i);
        bins.set(px, bin);
      }
      for (const [px, bin] of bins) {
        const h = bin.batch / peak * LANE;
        svg("rect", {"data-kind": "step-bin", x: px, y: top + LANE - h, width: 1, height: h,
          class: `step ${bin.prefill ? "prefill" : "decode"}${bin.mine ? " mine" : ""}`}, plot);
      }
      return;
    }
    for (const i of visible) {
      const h = Math.max(lane.num_requests[i] / peak * LANE, 1), x0 = x(lane.start_us[i]);
      const step = svg("rect", {"data-kind": "step", "data-index": i, "data-start-us": lane.start_us[i],
        "data-end-us": lane.end_us[i], "data-batch": lane.num_requests[i], "data-prefill-tokens": lane.prefill_tokens[i],
        x: x0, y: top + LANE - h, width: Math.max(x(lane.end_us[i]) - x0, 0.5), height: h,
        class: `step ${lane.prefill_tokens[i] > 0 ? "prefill" : "decode"}${mine.has(i) ? " mine" : ""}`}, plot);
      const forward = lane.forward_us[i] >= 0 ? `, forward ${seconds(lane.forward_us[i] / 1e6)}` : "";
      svg("title", {}, step, `step of ${seconds((lane.end_us[i] - lane.start_us[i]) / 1e6)}${forward}: ` +
        `${lane.num_requests[i]} request(s), ${lane.prefill_tokens[i]} prefill + ${lane.decode_tokens[i]} decode ` +
        `tokens; after it ${lane.running[i]} running, ${lane.waiting[i]} waiting, KV ${(lane.kv_usage[i] * 100).toFixed(1)}%`);
      if (lane.preemptions[i] > 0) {
        const at = x0, size = 4;
        svg("path", {"data-kind": "step-preempted", "data-index": i, d: `M${at - size},${top}H${at + size}L${at},${top + 6}Z`,
          class: "preempted"}, plot);
      }
    }
  });
}

// The steps of the open request's decode that computed prompt tokens, and whose prefill it was.
function drawInterference() {
  const table = $("interference");
  table.replaceChildren();
  const row = selectedRow(), lane = laneOf(row);
  if (!row || !lane || !row.decode) return;
  const firstUs = Number(BigInt(row.decode[0]) / 1000n);
  const steps = [...stepsOf(row, lane)].filter((i) => lane.end_us[i] > firstUs && lane.prefill_tokens[i] > 0);
  const tokens = steps.reduce((sum, i) => sum + lane.prefill_tokens[i], 0);
  html("caption", table, steps.length ? `${steps.length} step(s) of its decode computed ${tokens} prompt tokens ` +
    "of other requests (prefill-decode interference):" : "no other request's prefill ran during its decode");
  if (!steps.length) return;
  const head = html("tr", table);
  for (const title of ["step at", "step took", "prefill tokens", "requests in it", "prefilling then"]) html("th", head, title);
  for (const i of steps) {
    const tr = html("tr", table, undefined, {"data-kind": "interference", "data-index": i,
      "data-prefill-tokens": lane.prefill_tokens[i]});
    html("td", tr, `+${((lane.start_us[i] - firstUs) / 1e3).toFixed(3)} ms after its first token`);
    html("td", tr, seconds((lane.end_us[i] - lane.start_us[i]) / 1e6));
    html("td", tr, String(lane.prefill_tokens[i]));
    html("td", tr, String(lane.num_requests[i]));
    const cell = html("td", tr);
    for (const other of timeline.rows) {
      if (other.trace_id === row.trace_id || other.instance !== row.instance || !other.prefill) continue;
      const a = Number(BigInt(other.prefill[0]) / 1000n), b = Number(BigInt(other.prefill[1]) / 1000n);
      if (a < lane.end_us[i] && b >= lane.start_us[i]) {
        const link = html("a", cell, other.trace_id.slice(0, 12), {href: "#", "data-trace-id": other.trace_id});
        link.addEventListener("click", (event) => { event.preventDefault(); update({trace: other.trace_id, span: null}); });
        cell.append(" ");
      }
    }
    if (!cell.childNodes.length) cell.textContent = "no first prefill: a preempted request recomputing";
  }
}

function scale(width) {
  return (ns) => LEFT + (ms(ns) - view[0]) / (view[1] - view[0]) * plotWidth(width);
}

function clipped(chart, id, top, width, height) {
  const clip = svg("clipPath", {id}, svg("defs", {}, chart));
  svg("rect", {x: LEFT, y: top - 2, width: plotWidth(width), height: height - top + 2}, clip);
  return svg("g", {"clip-path": `url(#${id})`}, chart);
}

function axis(chart, width, y, height) {
  const span = view[1] - view[0], step = TICK_MS.find((s) => s >= span / 8) || TICK_MS[TICK_MS.length - 1];
  const baseMs = Number(base / 1000000n) + Number(base % 1000000n) / 1e6;
  const group = svg("g", {class: "axis"}, chart);
  for (let t = Math.ceil((baseMs + view[0]) / step) * step; t <= baseMs + view[1]; t += step) {
    const at = LEFT + (t - baseMs - view[0]) / span * plotWidth(width), date = new Date(Math.floor(t));
    let label = date.toLocaleTimeString([], {hour12: false});
    if (step < 1e3) label += "." + String(date.getMilliseconds()).padStart(3, "0");
    if (step < 1) label += String(Math.round((t % 1) * 1e3)).padStart(3, "0");
    svg("line", {x1: at, x2: at, y1: y, y2: height, class: "grid"}, group);
    svg("text", {x: at + 2, y: y - 4}, group, label);
  }
}

function drawLoad(width, x) {
  const chart = $("load"), points = timeline.load, top = 14, height = 110, bottom = height - 4;
  chart.setAttribute("width", width);
  chart.setAttribute("height", height);
  const peak = Math.max(1, ...points.map((p) => Math.max(p.running, p.waiting)));
  const y = (v) => bottom - v / peak * (bottom - top);
  svg("line", {x1: LEFT, x2: width - RIGHT, y1: bottom, y2: bottom, class: "grid"}, chart);
  const title = svg("text", {x: LEFT, y: top - 3, class: "axis-label"}, chart, "load of the requests shown: ");
  svg("tspan", {class: "running"}, title, "━ running (prefill or decode)  ");
  svg("tspan", {class: "waiting"}, title, "╌ waiting (queue)");
  svg("text", {x: width - RIGHT, y: top + 9, class: "axis-label peak"}, chart, `peak ${peak}`);
  const plot = clipped(chart, "load-clip", top, width, height);
  for (const key of ["waiting", "running"]) {
    let d = "";
    for (const p of points) d += d ? `H${x(p.t_ns)}V${y(p[key])}` : `M${x(p.t_ns)},${y(0)}V${y(p[key])}`;
    svg("path", {"data-kind": key, "data-points": points.length, d: d || "M0,0", class: `load ${key}`}, plot);
  }
}

function zoomable(chart) {
  chart.addEventListener("wheel", (event) => {
    event.preventDefault();
    const width = chart.width.baseVal.value, span = view[1] - view[0];
    const at = view[0] + (event.offsetX - LEFT) / plotWidth(width) * span, factor = Math.exp(event.deltaY * 0.0015);
    view = [at - (at - view[0]) * factor, at + (view[1] - at) * factor];
    redraw();
  }, {passive: false});
  chart.addEventListener("mousedown", (event) => {
    const start = view.slice(), x0 = event.clientX, target = event.target;
    let moved = false;
    const move = (e) => {
      moved = moved || Math.abs(e.clientX - x0) > 3;
      if (!moved) return;
      const shift = (e.clientX - x0) / plotWidth(chart.width.baseVal.value) * (start[1] - start[0]);
      view = [start[0] - shift, start[1] - shift];
      redraw();
    };
    const up = () => {
      window.removeEventListener("mousemove", move);
      window.removeEventListener("mouseup", up);
      const row = target.closest && target.closest("[data-trace-id]");
      if (!moved && row) update({trace: row.dataset.traceId, span: null});
    };
    window.addEventListener("mousemove", move);
    window.addEventListener("mouseup", up);
  });
}

let pending = false;
function redraw() {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    drawTimeline();
    markSelected();
  });
}

function markSelected() {
  const selected = hashParams().get("trace");
  for (const row of document.querySelectorAll("#timeline g[data-kind=row]")) {
    row.classList.toggle("selected", row.dataset.traceId === selected);
  }
  if (timeline) drawLanes(document.documentElement.clientWidth - 32);
  drawInterference();
}

// -- one trace's waterfall ------------------------------------------------------------------

async function loadTrace(id) {
  trace = null;
  $("trace").hidden = !id;
  $("trace-status").textContent = "";
  if (!id) return;
  $("trace-id").textContent = id;
  $("trace-json").href = "/api/traces/" + encodeURIComponent(id);
  try {
    [trace] = await getData("/api/traces/" + encodeURIComponent(id));
    requestAnimationFrame(() => $("trace").scrollIntoView());
  } catch (err) {
    $("trace-status").textContent = err.message;
  }
}

function spanTree(spans) {
  const ids = new Set(spans.map((s) => s.spanID)), children = new Map(), order = [], seen = new Set();
  for (const s of spans) {
    const ref = s.references.find((r) => r.traceID === s.traceID && ids.has(r.spanID) && r.spanID !== s.spanID);
    const parent = ref ? ref.spanID : "";
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(s);
  }
  const visit = (parent, depth) => {
    for (const s of (children.get(parent) || []).sort((a, b) => a.startTime - b.startTime)) {
      if (seen.has(s.spanID)) continue;
      seen.add(s.spanID);
      order.push({span: s, depth, parent});
      visit(s.spanID, depth + 1);
    }
  };
  visit("", 0);
  for (const s of spans) if (!seen.has(s.spanID)) order.push({span: s, depth: 0, parent: ""});  // a cycle
  return order;
}

const tag = (s, key) => (s.tags.find((t) => t.key === key) || {}).value;
const eventName = (log) => (log.fields.find((f) => f.key === "event") || {}).value || "event";

function drawWaterfall(selectedId) {
  const chart = $("waterfall"), table = $("attributes");
  chart.replaceChildren();
  table.replaceChildren();
  if (!trace) return;
  const order = spanTree(trace.spans), rowHeight = 20, label = 300, width = document.documentElement.clientWidth - 32;
  const t0 = Math.min(...trace.spans.map((s) => s.startTime));
  const t1 = Math.max(...trace.spans.map((s) => s.startTime + s.duration)), span = Math.max(t1 - t0, 1);
  const x = (us) => label + (us - t0) / span * (width - label - 90);
  chart.setAttribute("width", width);
  chart.setAttribute("height", order.length * rowHeight + 4);
  const request = order.find((o) => o.span.tags.some((t) => t.key.startsWith("gen_ai.latency."))) || order[0];
  const selected = (order.find((o) => o.span.spanID === selectedId) || request).span;
  order.forEach(({span: s, depth, parent}, i) => {
    const y = i * rowHeight + 2, end = s.startTime + s.duration, kind = PHASES.includes(s.operationName)
      ? s.operationName : s === request.span ? "llm-request" : "other";
    const classes = ["span-row", kind, tag(s, "error") ? "error" : "", tag(s, "otel_llm.derived") ? "derived" : "",
      s === selected ? "selected" : ""].join(" ");
    const row = svg("g", {"data-kind": "span-row", "data-span-id": s.spanID, "data-parent-span-id": parent,
      "data-depth": depth, class: classes}, chart);
    svg("rect", {x: 0, y: y - 1, width, height: rowHeight, class: "hit"}, row);
    svg("text", {x: 6 + depth * 14, y: y + 13, class: "name"}, row, s.operationName);
    svg("text", {x: label - 6, y: y + 13, class: "service"}, row, trace.processes[s.processID].serviceName);
    const bar = svg("rect", {"data-kind": "span", "data-span-id": s.spanID, "data-operation": s.operationName,
      "data-start-us": s.startTime, "data-end-us": end, x: x(s.startTime), y: y + 3,
      width: Math.max(x(end) - x(s.startTime), 1), height: rowHeight - 8, class: "bar"}, row);
    svg("title", {}, bar, `${s.operationName}: ${s.duration} µs from +${((s.startTime - t0) / 1e3).toFixed(3)} ms`);
    svg("text", {x: x(end) + 4, y: y + 13, class: "duration"}, row, seconds(s.duration / 1e6));
    for (const log of s.logs) {
      const at = x(log.timestamp), name = eventName(log);
      const mark = svg("path", {"data-kind": "event", "data-span-id": s.spanID, "data-name": name,
        "data-time-us": log.timestamp, d: `M${at},${y + 1}l4,6l-4,6l-4,-6Z`, class: `event ${name}`}, row);
      svg("title", {}, mark, `${name} at +${((log.timestamp - t0) / 1e3).toFixed(3)} ms`);
    }
    row.addEventListener("click", () => update({span: s.spanID}));
  });
  attributes(table, selected);
}

function attributes(table, s) {
  table.dataset.spanId = s.spanID;
  const section = (title) => html("th", html("tr", table), title, {colspan: 2});
  const line = (key, value, kind) => {
    const tr = html("tr", table, undefined, {"data-key": key, "data-section": kind});
    html("td", tr, key);
    html("td", tr, typeof value === "string" ? value : JSON.stringify(value));
  };
  section(`${s.operationName} · span ${s.spanID}`);
  line("start", `${new Date(s.startTime / 1e3).toISOString()} (${s.startTime} µs)`, "span");
  line("duration", `${s.duration} µs`, "span");
  for (const t of s.tags) line(t.key, t.value, "tag");
  section(`resource: ${trace.processes[s.processID].serviceName}`);
  for (const t of trace.processes[s.processID].tags) line(t.key, t.value, "resource");
  if (s.logs.length) section("events");
  for (const log of s.logs) {
    line(`${eventName(log)} +${((log.timestamp - s.startTime) / 1e3).toFixed(3)} ms`,
      log.fields.filter((f) => f.key !== "event").map((f) => `${f.key}=${f.value}`).join(" "), "event");
  }
}

// -- controls -------------------------------------------------------------------------------

function bind() {
  for (const button of document.querySelectorAll("[data-lookback]")) {
    button.addEventListener("click", () => update({lookback: button.dataset.lookback, start: null, end: null,
      ...Object.fromEntries(REGION.map((k) => [k, null]))}));
  }
  $("apply-window").addEventListener("click", () => {
    const us = (input) => input.value ? String(new Date(input.value).getTime() * 1000) : null;
    update({lookback: null, start: us($("start")), end: us($("end")), ...Object.fromEntries(REGION.map((k) => [k, null]))});
  });
  $("refresh").addEventListener("click", () => { loaded.query = overviewLoaded = null; onUrl(); });
  bindOverview();
  for (const input of document.querySelectorAll("#filters [data-param]")) {
    input.addEventListener("change", () => update({[input.dataset.param]: input.value}));
  }
  $("clear-filters").addEventListener("click", () => update(Object.fromEntries(FILTERS.map((k) => [k, null]))));
  $("reset-zoom").addEventListener("click", () => { view = full.slice(); redraw(); });
  $("close-trace").addEventListener("click", () => update({trace: null, span: null}));
  $("filters").addEventListener("submit", (event) => event.preventDefault());
  zoomable($("timeline"));
  zoomable($("lanes"));
  zoomable($("load"));
  window.addEventListener("hashchange", onUrl);
  window.addEventListener("resize", () => { drawOverview(); redraw(); drawWaterfall(hashParams().get("span")); });
}

bind();
onUrl();
