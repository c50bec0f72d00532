// The report page (train/report.h): the HTML, its style and the script that draws the charts
// with uPlot from the embedded JSON. The script writes, on each chart's element after drawing,
// data-points (the points its series hold) and, on the timeline, data-incidents (the markers
// placed), which tests read from the rendered page.
#include <filesystem>

#include "atoll/core/file_writer.h"
#include "atoll/core/log.h"
#include "atoll/train/report.h"
#include "atoll/train/report_assets.h"

namespace atl {
namespace {

constexpr const char* kPageCss = R"css(
body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#222;max-width:1300px}
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:22px 0 6px}
.note{background:#fff4d6;border-left:4px solid #e0a800;padding:4px 8px;margin:4px 0}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(600px,1fr));gap:12px}
.chart{position:relative;border:1px solid #ddd;padding:6px}.chart .empty{color:#888;padding:30px}
.chart .missing{color:#a60;font-size:12px}
.incident{position:absolute;top:0;bottom:0;width:3px;margin-left:-1px;opacity:.75;cursor:help}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
pre{background:#f6f6f6;padding:8px;overflow:auto;max-height:400px}
)css";

constexpr const char* kPageScript = R"js(
"use strict";
const D = JSON.parse(document.getElementById("atoll-data").textContent);
const runs = D.runs, many = runs.length > 1;
const COLORS = ["#1f77b4","#d62728","#2ca02c","#ff7f0e","#9467bd","#8c564b","#e377c2","#17becf","#7f7f7f","#bcbd22"];
const el = (tag, attrs, text) => { const e = document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]); if (text !== undefined) e.textContent = text; return e; };
const num = v => typeof v === "number" && isFinite(v);
const t0 = run => { const ts = run.events.map(e => e.time).filter(num); return ts.length ? Math.min(...ts) : 0; };
// A run's rows by island (and rank other than 0): one curve each.
function groups(run) {
  const g = new Map();
  for (const r of run.rows) {
    if (!num(r.step)) continue;
    const key = r.island === undefined ? "" : "island " + r.island + (r.rank ? " rank " + r.rank : "");
    if (!g.has(key)) g.set(key, []);
    g.get(key).push(r);
  }
  return [...g.entries()].sort((a, b) => a[0].localeCompare(b[0], undefined, {numeric: true}));
}
const label = (run, key) => [many ? run.name : "", key].filter(s => s).join(" ") || run.name;
const xOf = (r, x) => x === "tokens" ? (num(r.tokens) ? r.tokens : r.step) : x === "time" ? r.time_s : r.step;
// The series of one field: per run and group, the rows that have it.
function fieldSeries(field, x, opts) {
  const out = [];
  runs.forEach((run, ri) => groups(run).forEach(([key, rows], gi) => {
    const pts = rows.filter(r => num(pick(r, field)) && num(xOf(r, x))).map(r => [xOf(r, x), pick(r, field)]);
    // A second field on the same chart (val_loss beside loss) names itself in the legend.
    const name = [key, (opts || {}).suffix].filter(t => t).join(" ");
    if (pts.length) out.push(Object.assign({label: label(run, name), pts, run: ri, group: gi}, opts || {}));
  }));
  return out;
}
function pick(r, f) { if (typeof f === "function") return f(r); return r[f]; }
// Lists per layer (expert load): one series per layer of each run and group.
function layerSeries(field) {
  const out = [];
  runs.forEach((run, ri) => groups(run).forEach(([key, rows], gi) => {
    const layers = new Map();
    for (const r of rows) (r[field] || []).forEach((v, i) => {
      const L = (r.load_layer || [])[i] ?? i;
      if (!num(v)) return;
      if (!layers.has(L)) layers.set(L, []);
      layers.get(L).push([r.step, v]);
    });
    [...layers.entries()].sort((a, b) => a[0] - b[0]).forEach(([L, pts], li) =>
      out.push({label: label(run, key + " layer " + L), pts, run: ri, group: gi + li}));
  }));
  return out;
}
function mapSeries(field, x) {
  const out = [];
  runs.forEach((run, ri) => groups(run).forEach(([key, rows], gi) => {
    const names = new Set(); rows.forEach(r => Object.keys(r[field] || {}).forEach(k => names.add(k)));
    [...names].sort().forEach((n, ni) => {
      const pts = rows.filter(r => r[field] && num(r[field][n])).map(r => [xOf(r, x), r[field][n]]);
      if (pts.length) out.push({label: label(run, key + " " + n), pts, run: ri, group: gi + ni, points: true});
    });
  }));
  return out;
}
// Fields named by a prefix (train.eval_tasks' "task/<name>/acc"): one series per field of each run and group.
function prefixSeries(prefix, x) {
  const out = [];
  runs.forEach((run, ri) => groups(run).forEach(([key, rows], gi) => {
    const names = new Set(); rows.forEach(r => Object.keys(r).forEach(k => { if (k.startsWith(prefix)) names.add(k); }));
    [...names].sort().forEach((n, ni) => {
      const pts = rows.filter(r => num(r[n]) && num(xOf(r, x))).map(r => [xOf(r, x), r[n]]);
      if (pts.length) out.push({label: label(run, key + " " + n.slice(prefix.length)), pts, run: ri, group: gi + ni, points: true});
    });
  }));
  return out;
}
const hasField = (r, f) => f.endsWith("*") ? Object.keys(r).some(k => k.startsWith(f.slice(0, -1))) : r[f] !== undefined;
const ckptStall = r => (num(r.ckpt_stall_s) || num(r.ckpt_fence_s)) ? (r.ckpt_stall_s || 0) + (r.ckpt_fence_s || 0) : undefined;
const outerOrStep = r => num(r.outer_step) ? r.outer_step : undefined;
const CHARTS = [
  {id: "loss", title: "loss (and validation loss, points) against tokens", x: "tokens", fields: ["loss", "val_loss"],
   series: () => fieldSeries("loss", "tokens").concat(fieldSeries("val_loss", "tokens", {points: true, val: true, suffix: "val_loss"}))},
  {id: "val_losses", title: "validation loss per dataset of the mixture", x: "tokens", fields: ["val_losses"], optional: true,
   series: () => mapSeries("val_losses", "tokens")},
  {id: "tasks", title: "task scores (train.eval_tasks: acc, acc_norm) against tokens", x: "tokens", fields: ["task/*"],
   optional: true, series: () => prefixSeries("task/", "tokens")},
  {id: "lr", title: "learning rate", x: "step", fields: ["lr"], series: () => fieldSeries("lr", "step")},
  {id: "grad_norm", title: "gradient norm", x: "step", fields: ["grad_norm"], series: () => fieldSeries("grad_norm", "step")},
  {id: "tokens_per_s", title: "tokens/s", x: "step", fields: ["tokens_per_s"], series: () => fieldSeries("tokens_per_s", "step")},
  {id: "mfu", title: "MFU", x: "step", fields: ["mfu"], optional: true, series: () => fieldSeries("mfu", "step")},
  {id: "comm_bytes", title: "bytes sent per island (cumulative)", x: "step", fields: ["comm_bytes"], optional: true,
   series: () => fieldSeries("comm_bytes", "step")},
  {id: "ckpt", title: "checkpoint stall (s: blocked at the save + waited at the fence)", x: "step",
   fields: ["ckpt_stall_s", "ckpt_fence_s"], optional: true, series: () => fieldSeries(ckptStall, "step", {points: true})},
  {id: "load_entropy", title: "expert load: normalised entropy per layer", x: "step", fields: ["load_entropy"], optional: true,
   series: () => layerSeries("load_entropy")},
  {id: "load_max", title: "expert load: largest share per layer", x: "step", fields: ["load_max"], optional: true,
   series: () => layerSeries("load_max")},
  {id: "load_min", title: "expert load: smallest share per layer", x: "step", fields: ["load_min"], optional: true,
   series: () => layerSeries("load_min")},
  {id: "load_skip", title: "expert load: share of slots skipped per layer", x: "step", fields: ["load_skip"], optional: true,
   series: () => layerSeries("load_skip")},
];
let smoothing = 0;
function smooth(ys) {
  if (!smoothing) return ys;
  let s = null;
  return ys.map(y => y == null ? null : (s = s == null ? y : smoothing * s + (1 - smoothing) * y));
}
// Sorted by x, one point per x (the last logged), as uPlot.join wants.
function clean(pts) {
  const m = new Map(); for (const [x, y] of pts) m.set(x, y);
  return [...m.entries()].sort((a, b) => a[0] - b[0]);
}
function aligned(series) {
  const tables = series.map(s => { const p = clean(s.pts); return [p.map(q => q[0]), s.points ? p.map(q => q[1]) : smooth(p.map(q => q[1]))]; });
  return uPlot.join(tables);
}
const color = s => COLORS[(many ? s.run * 3 + s.group : s.group) % COLORS.length];
// Axis ticks in SI units: 1.2M tokens, 35k bytes, 0.0003 stays as it is.
function si(v) {
  if (v == null) return "";
  const a = Math.abs(v);
  for (const [d, p] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]) if (a >= d) return +(v / d).toPrecision(3) + p;
  return String(+v.toPrecision(3));
}
const live = [];
function draw(box, spec, series, extra) {
  const width = Math.max(480, box.clientWidth - 14);
  const opts = {title: spec.title, width, height: 260, scales: {x: {time: false}},
    axes: [{label: spec.xlabel || spec.x, values: (u, vs) => vs.map(si)}, {size: 60, values: (u, vs) => vs.map(si)}],
    legend: {live: true},
    series: [{label: spec.xlabel || spec.x}].concat(series.map(s => ({label: s.label, stroke: color(s),
      width: 1.5, spanGaps: true,
      points: s.points ? {show: true, size: 6, fill: color(s)} : {show: false},
      paths: s.points ? () => null : undefined}))),
    hooks: {draw: [u => { box.setAttribute("data-points", String(series.reduce((n, s) => n + clean(s.pts).length, 0)));
      box.setAttribute("data-labels", series.map(s => s.label).join("|"));
      if (extra) extra(u); }]}};
  const u = new uPlot(opts, aligned(series), box);
  live.push({u, series});
}
function chart(spec, parent) {
  const box = el("div", {class: "chart", id: "chart-" + spec.id, "data-chart": spec.id});
  const series = spec.series();
  if (!series.length) {
    if (spec.optional) return;
    parent.appendChild(box);
    box.setAttribute("data-points", "0");
    box.appendChild(el("div", {class: "empty"}, spec.title + ": no data (" + spec.fields.join(", ") + " not logged)"));
    return;
  }
  parent.appendChild(box);
  if (many) {
    const lacking = runs.filter(run => !run.rows.some(r => spec.fields.some(f => hasField(r, f)))).map(r => r.name);
    if (lacking.length) box.appendChild(el("div", {class: "missing"}, "not logged by " + lacking.join(", ")));
  }
  draw(box, spec, series);
}
// The timeline: each island's outer step (the step when there are none) against seconds since the
// run's first event, with every events.jsonl incident a marker; hover a marker for its fields.
function timeline(parent) {
  const box = el("div", {class: "chart", id: "chart-timeline", "data-chart": "timeline"});
  parent.appendChild(box);
  const outer = runs.some(run => run.rows.some(r => num(r.outer_step)));
  let series = outer ? fieldSeries(outerOrStep, "time") : fieldSeries("step", "time");
  const incidents = [];
  runs.forEach((run, ri) => { const z = t0(run);
    run.events.forEach(e => { if (num(e.time)) incidents.push({x: e.time - z, e, run: ri}); }); });
  const marks = {label: "incidents", pts: incidents.map(i => [i.x, 0]), run: 0, group: 9, points: true};
  if (!series.length && !incidents.length) {
    box.setAttribute("data-points", "0"); box.setAttribute("data-incidents", "0");
    box.appendChild(el("div", {class: "empty"}, "timeline: no rows and no events")); return;
  }
  const spec = {title: "timeline: " + (outer ? "outer step" : "step") + " per island, incidents of events.jsonl (hover the markers)",
    x: "time", xlabel: "seconds since the run's first event"};
  const placed = [];
  draw(box, spec, series.concat(incidents.length ? [marks] : []), u => {
    placed.forEach(m => m.remove()); placed.length = 0;
    for (const i of incidents) {
      const left = u.valToPos(i.x, "x");
      const fields = Object.entries(i.e).filter(([k]) => k !== "event" && k !== "time").map(([k, v]) => k + "=" + JSON.stringify(v)).join(" ");
      const m = el("div", {class: "incident", "data-event": String(i.e.event),
        title: (many ? runs[i.run].name + ": " : "") + i.e.event + " at " + i.x.toFixed(1) + " s " + fields});
      m.style.left = left + "px"; m.style.background = incidentColor(i.e.event);
      u.over.appendChild(m); placed.push(m);
    }
    box.setAttribute("data-incidents", String(placed.length));
    box.setAttribute("data-points", String(series.reduce((n, s) => n + clean(s.pts).length, 0)));
  });
}
function incidentColor(name) {
  if (/lost|fail|kill|crash|rollback|drop|clip|straggl|interrupt|preempt/.test(name)) return "#d62728";
  if (/restart|join|resume|reshape/.test(name)) return "#2ca02c";
  if (/checkpoint/.test(name)) return "#999";
  return "#ff7f0e";
}
function summary(parent) {
  const t = el("table"); const head = el("tr");
  ["run", "parameters", "steps", "tokens", "wall time", "final loss", "final val_loss", "incidents"].forEach(h => head.appendChild(el("th", {}, h)));
  t.appendChild(head);
  for (const run of runs) {
    const tr = el("tr");
    const start = run.events.find(e => num(e.params));
    const maxOf = f => run.rows.reduce((m, r) => num(r[f]) && r[f] > m ? r[f] : m, -Infinity);
    const fin = f => groups(run).map(([k, rows]) => { const r = [...rows].reverse().find(r => num(r[f]));
      return r ? (k ? k + ": " : "") + r[f].toFixed(4) : ""; }).filter(s => s).join(", ") || "-";
    const wall = Math.max(maxOf("time_s"), run.events.length ? Math.max(...run.events.map(e => e.time || 0)) - t0(run) : -Infinity);
    [run.name + " (" + run.dir + ")", start ? String(start.params) : "-", isFinite(maxOf("step")) ? String(maxOf("step")) : "-",
     isFinite(maxOf("tokens")) ? String(maxOf("tokens")) : "-", isFinite(wall) ? wall.toFixed(1) + " s" : "-",
     fin("loss"), fin("val_loss"), String(run.events.length)].forEach(c => tr.appendChild(el("td", {}, c)));
    t.appendChild(tr);
  }
  parent.appendChild(t);
  for (const run of runs) {
    for (const [what, text] of [["summary.txt (with the sample)", run.summary], ["config.toml", run.config]]) {
      if (!text) continue;
      const d = el("details"); d.appendChild(el("summary", {}, run.name + ": " + what)); d.appendChild(el("pre", {}, text));
      parent.appendChild(d);
    }
  }
}
function main() {
  const root = document.getElementById("report");
  root.appendChild(el("h1", {}, "atoll report: " + runs.map(r => r.name).join(" vs ")));
  for (const run of runs) for (const n of run.notes) root.appendChild(el("div", {class: "note"}, (many ? run.name + ": " : "") + n));
  const ctl = el("label", {}, "smoothing (exponential moving average) ");
  const slider = el("input", {type: "range", min: "0", max: "0.99", step: "0.01", value: "0", id: "smoothing"});
  ctl.appendChild(slider); root.appendChild(ctl);
  root.appendChild(el("h2", {}, "summary")); summary(root);
  root.appendChild(el("h2", {}, "timeline"));
  const tl = el("div", {class: "charts"}); root.appendChild(tl); timeline(tl);
  root.appendChild(el("h2", {}, "metrics"));
  const grid = el("div", {class: "charts"}); root.appendChild(grid);
  for (const spec of CHARTS) chart(spec, grid);
  slider.addEventListener("input", () => { smoothing = +slider.value;
    for (const c of live) c.u.setData(aligned(c.series)); });
  document.body.setAttribute("data-rendered", String(live.length));
}
try { main(); } catch (e) {
  const d = el("div", {class: "note", id: "report-error"}, "the page failed to draw: " + e); document.body.prepend(d);
}
)js";

// JSON inside <script>: "<" only occurs in strings, where \u003c reads the same and no
// "</script>" can end the element early.
std::string embed_json(const nlohmann::json& j) {
  const std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '<')
      out.append("\\u003c");
    else
      out.push_back(c);
  }
  return out;
}

}  // namespace

std::string report_html(const std::vector<nlohmann::json>& runs) {
  std::string title = "atoll report";
  for (const auto& r : runs) {
    title.push_back(' ');
    title.append(r.value("name", std::string()));
  }
  for (char& c : title)
    if (c == '<' || c == '&') c = ' ';
  std::string page = "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>";
  page += title;
  page += "</title>\n<style>";
  page += kUplotCss;
  page += kPageCss;
  page += "</style>\n<script>";
  page += kUplotJs;
  page += "</script>\n</head><body><div id=\"report\"></div>\n<script type=\"application/json\" id=\"atoll-data\">";
  page += embed_json({{"runs", runs}});
  page += "</script>\n<script>";
  page += kPageScript;
  page += "</script>\n</body></html>\n";
  return page;
}

void write_run_report(const std::string& run_dir) {
  try {
    write_file_atomic(run_dir + "/report.html", report_html({load_report_run(run_dir)}));
  } catch (const std::exception& e) {
    log_warn("could not write " + run_dir + "/report.html (the run goes on): " + e.what());
  }
}

}  // namespace atl
