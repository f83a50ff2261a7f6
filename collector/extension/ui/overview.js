// The overview above the request timeline (collector/web_ui.py): every request of the window, from
// /api/llm/heatmap, as a latency heatmap (columns of whole 10 s steps, log-spaced latency buckets,
// density as colour; failed, aborted and preempted requests marked) with the mean requests waiting and
// running under it. Dragging over it selects a region (a time range by a latency range): the rows
// below become that region's requests (/api/llm/timeline with the region) and /api/llm/bubbleup says
// what sets them apart from the rest of their time range. The region is in the URL fragment
// (rstart, rend: µs; rmin, rmax: seconds; with the overview's metric), so a selection is a link.
// Shares timeline.js's helpers ($, svg, html, getData, hashParams, update).
"use strict";

const REGION = ["rstart", "rend", "rmin", "rmax"];
const METRIC_NAMES = {ttft: "TTFT", e2e: "e2e latency", queue: "queue time", itl: "inter-token latency"};
const HEAT = 170, MARKS = 12, OVERVIEW_LOAD = 46, LABELS = 58;  // px: heatmap, overlay strip, load, y labels
let overview = null;  // the last /api/llm/heatmap data
let overviewLoaded = null, bubbleLoaded = null;

const overviewMetric = () => hashParams().get("metric") || "ttft";

// The timeline's query: the region's (time and latency range) when one is selected, else the window's.
function regionQuery(p, query) {
  if (!p.get("rstart")) return query;
  const q = new URLSearchParams(query);
  for (const key of ["lookback", "start", "end"]) q.delete(key);
  q.set("start", p.get("rstart"));
  q.set("end", p.get("rend"));
  if (p.get("rmin") || p.get("rmax")) q.set("metric", overviewMetric());
  if (p.get("rmin")) q.set("min", p.get("rmin"));
  if (p.get("rmax")) q.set("max", p.get("rmax"));
  return q.toString();
}

async function routeOverview(p, windowQuery) {
  const query = `${windowQuery}&metric=${overviewMetric()}`;
  if (query !== overviewLoaded) {
    overviewLoaded = query;
    try {
      overview = await getData("/api/llm/heatmap?" + query);
      $("overview-status").textContent = "";
    } catch (err) {
      overview = null;
      $("overview-status").textContent = "overview: " + err.message;
    }
    drawOverview();
    document.body.dataset.overviewMs = String(Math.round(performance.now()));
  }
  const region = p.get("rstart") ? regionQuery(p, "") : "";
  if (region !== bubbleLoaded) {
    bubbleLoaded = region;
    drawOverview();  // the region's outline
    let dims = null;
    if (region) {
      try { dims = await getData("/api/llm/bubbleup?" + region); } catch (err) { dims = err.message; }
    }
    drawBubbleup(dims);
  }
  $("metric").value = overviewMetric();
  $("clear-region").hidden = !p.get("rstart");
}

function drawOverview() {
  const chart = $("overview"), width = document.documentElement.clientWidth - 32;
  chart.replaceChildren();
  if (!overview) { chart.setAttribute("height", 0); return; }
  const o = overview, valued = o.cells.filter((c) => c[1] !== o.no_value_bucket);
  const lo = valued.length ? Math.min(...valued.map((c) => c[1])) : 0, hi = Math.max(lo, ...valued.map((c) => c[1]));
  const rows = hi - lo + 1 + (o.no_value ? 2 : 0), cellH = HEAT / rows, top = MARKS + 16;
  const height = top + HEAT + 18 + OVERVIEW_LOAD + 4, left = LABELS, plot = width - left - RIGHT;
  chart.setAttribute("width", width);
  chart.setAttribute("height", height);
  const x = (col) => left + col / o.columns * plot, colW = plot / o.columns;
  const y = (b) => b === o.no_value_bucket ? top + HEAT - cellH : top + (hi - b) * cellH;
  const peak = Math.max(1, ...o.cells.map((c) => c[2]));
  const when = (us) => new Date(us / 1e3).toLocaleTimeString([], {hour12: false});
  svg("text", {x: left, y: 11, class: "axis-label"}, chart, `every one of ${o.requests} requests by start and ` +
    `${METRIC_NAMES[o.metric]} (${o.step_us / 1e6} s columns; darker: more requests, at most ${peak} in a cell; ` +
    `red: failed or aborted, pink: preempted)` + (o.no_value ? `; ${o.no_value} without it, at the bottom` : "") +
    " · drag to select a region");
  let decades = 0;
  for (let b = Math.ceil(lo / o.per_decade) * o.per_decade; b <= hi; b += o.per_decade, decades++) {  // decades
    svg("line", {x1: left, x2: width - RIGHT, y1: y(b) + cellH, y2: y(b) + cellH, class: "grid"}, chart);
    svg("text", {x: left - 4, y: y(b) + cellH, class: "axis-label peak"}, chart, seconds(10 ** (b / o.per_decade)));
  }
  if (!decades && valued.length) {  // all within one decade: the range's own bounds
    svg("text", {x: left - 4, y: y(hi) + 9, class: "axis-label peak"}, chart, seconds(10 ** ((hi + 1) / o.per_decade)));
    svg("text", {x: left - 4, y: y(lo) + cellH, class: "axis-label peak"}, chart, seconds(10 ** (lo / o.per_decade)));
  }
  const marks = new Map();  // column -> [failed or aborted, preempted]
  const group = svg("g", {"data-kind": "heatmap", "data-metric": o.metric, "data-requests": o.requests}, chart);
  for (const [col, b, n, failed, aborted, preempted] of o.cells) {
    const shade = Math.log1p(n) / Math.log1p(peak);
    svg("rect", {"data-kind": "cell", "data-column": col, "data-bucket": b, "data-requests": n, "data-failed": failed,
      "data-aborted": aborted, "data-preempted": preempted, x: x(col), y: y(b), width: Math.max(colW, 1),
      height: Math.max(cellH, 1), fill: `hsl(215, 70%, ${Math.round(94 - shade * 66)}%)`,
      class: failed ? "cell failed" : "cell"}, group);
    const m = marks.get(col) || [0, 0];
    m[0] += failed;
    m[1] += preempted;
    marks.set(col, m);
  }
  const markPeak = Math.max(1, ...[...marks.values()].flat());
  for (const [col, [failed, preempted]] of marks) {
    for (const [k, count, cls] of [[0, failed, "failed"], [1, preempted, "preempted"]]) {
      if (!count) continue;
      const h = Math.max(2, count / markPeak * MARKS);
      svg("rect", {"data-kind": `overview-${cls}`, "data-column": col, "data-count": count,
        x: x(col) + k * colW / 2, y: top - 4 - h, width: Math.max(colW / 2, 1), height: h, class: `mark ${cls}`}, chart);
    }
  }
  for (const col of [0, Math.floor(o.columns / 2)]) {
    svg("text", {x: x(col), y: top + HEAT + 13, class: "axis-label"}, chart, when(o.start_us + col * o.step_us));
  }
  svg("text", {x: x(o.columns), y: top + HEAT + 13, class: "axis-label peak"}, chart,  // where the last column ends
    when(o.start_us + o.columns * o.step_us));
  const loadTop = top + HEAT + 18, loadPeak = Math.max(1, ...o.load.map((l) => Math.max(l[1], l[2])));
  const ly = (v) => loadTop + OVERVIEW_LOAD - v / loadPeak * OVERVIEW_LOAD;
  svg("text", {x: left - 4, y: loadTop + 9, class: "axis-label peak"}, chart, `${loadPeak.toFixed(1)}`);
  for (const [key, k] of [["waiting", 1], ["running", 2]]) {
    let d = "";
    for (const l of o.load) d += `${d ? "L" : "M"}${x(l[0] + 0.5)},${ly(l[k])}`;
    svg("path", {"data-kind": `overview-${key}`, "data-points": o.load.length, d: d || "M0,0", class: `load ${key}`},
      chart);
  }
  drawRegion(chart, x, y, cellH, top);
  selectable(chart, {x, y, top, left, plot, cellH, hi, rows});
}

// The selected region, outlined on the heatmap.
function drawRegion(chart, x, y, cellH, top) {
  const p = hashParams(), o = overview;
  if (!p.get("rstart")) return;
  const c0 = (Number(p.get("rstart")) - o.start_us) / o.step_us, c1 = (Number(p.get("rend")) + 1 - o.start_us) / o.step_us;
  const b = (s) => Math.log10(Number(s)) * o.per_decade;
  const yTop = p.get("rmax") ? y(Math.round(b(p.get("rmax"))) - 1) : top;
  const yBottom = p.get("rmin") ? y(Math.round(b(p.get("rmin")))) + cellH : top + HEAT;
  svg("rect", {"data-kind": "region", x: x(c0), y: yTop, width: Math.max(x(c1) - x(c0), 1),
    height: Math.max(yBottom - yTop, 1), class: "region"}, chart);
}

function selectable(chart, g) {
  chart.onmousedown = (event) => {
    const box = chart.getBoundingClientRect(), at = (e) => [e.clientX - box.left, e.clientY - box.top];
    const [x0, y0] = at(event);
    if (x0 < g.left || y0 < g.top || y0 > g.top + HEAT) return;
    const rubber = svg("rect", {class: "region rubber", x: x0, y: y0, width: 0, height: 0}, chart);
    const move = (e) => {
      const [x1, y1] = at(e);
      rubber.setAttribute("x", Math.min(x0, x1));
      rubber.setAttribute("y", Math.min(y0, y1));
      rubber.setAttribute("width", Math.abs(x1 - x0));
      rubber.setAttribute("height", Math.abs(y1 - y0));
    };
    const up = (e) => {
      window.removeEventListener("mousemove", move);
      window.removeEventListener("mouseup", up);
      rubber.remove();
      const [x1, y1] = at(e), o = overview;
      const col = (px) => Math.min(o.columns - 1, Math.max(0, Math.floor((px - g.left) / g.plot * o.columns)));
      const row = (py) => Math.min(g.rows - 1, Math.max(0, Math.floor((py - g.top) / g.cellH)));
      const [ca, cb] = [col(Math.min(x0, x1)), col(Math.max(x0, x1))];
      const [ra, rb] = [row(Math.min(y0, y1)), row(Math.max(y0, y1))];
      const valuedRows = g.rows - (o.no_value ? 2 : 0);
      const region = {rstart: String(o.start_us + ca * o.step_us), rend: String(o.start_us + (cb + 1) * o.step_us - 1),
        rmin: null, rmax: null, trace: null, span: null};
      if (rb < valuedRows) {  // a latency range (a selection reaching the requests without the figure has none)
        region.rmax = String(+(10 ** ((g.hi - ra + 1) / o.per_decade)).toPrecision(6));
        region.rmin = String(+(10 ** ((g.hi - rb) / o.per_decade)).toPrecision(6));
      }
      update(region);
    };
    window.addEventListener("mousemove", move);
    window.addEventListener("mouseup", up);
  };
}

// BubbleUp: per dimension, the values whose share among the selected requests differs most from the rest's.
function drawBubbleup(dims) {
  const table = $("bubbleup");
  table.replaceChildren();
  if (dims === null) return;
  if (typeof dims === "string") { html("caption", table, "what sets them apart: " + dims); return; }
  html("caption", table, "what sets the selected requests apart from the rest of their time range:");
  const head = html("tr", table);
  for (const title of ["", "value", "selected", "rest of the time range"]) html("th", head, title);
  for (const d of dims) {
    for (const v of d.values.slice(0, 3)) {
      if (!v.selected && !v.rest) continue;
      const tr = html("tr", table, undefined, {"data-kind": "bubbleup", "data-dimension": d.dimension,
        "data-value": v.value, "data-selected": v.selected, "data-rest": v.rest});
      html("td", tr, d.dimension.replace("_", " "));
      html("td", tr, v.value || "(none)");
      for (const [count, share] of [[v.selected, v.selected_share], [v.rest, v.rest_share]]) {
        const cell = html("td", tr);
        html("span", cell, "", {class: "share", style: `width: ${Math.round(share * 120)}px`});
        cell.append(` ${(share * 100).toFixed(1)} % (${count})`);
      }
    }
  }
}

function bindOverview() {
  $("metric").addEventListener("change", () => update({metric: $("metric").value, rmin: null, rmax: null}));
  $("clear-region").addEventListener("click", () => update(Object.fromEntries(REGION.map((k) => [k, null]))));
}
