// The live view's page (status_model.h status_page): one table of the islands, filled from
// status.json (a relative URL, so the page also works behind a proxy's path) every second by its
// own script. Everything it shows goes in through textContent, never as markup; it loads no
// font, script, style or image from anywhere.
#include "atoll/supervise/status_model.h"

namespace atl {

const std::string& status_page() {
  static const std::string kPage = R"atoll_page(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>atoll: islands</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.2em; margin: 0 0 .3em; }
#run { color: #555; margin-bottom: 1em; }
#error { color: #b00; font-weight: bold; }
table { border-collapse: collapse; }
th, td { padding: .3em .8em; border-bottom: 1px solid #ddd; text-align: right; }
th { background: #f4f4f4; }
td.state { text-align: left; font-weight: bold; }
.training { color: #070; } .exchanging { color: #06a; } .recovering { color: #a60; }
.joining { color: #a60; } .starting { color: #666; } .out { color: #b00; } .done { color: #444; }
</style>
</head>
<body>
<h1>atoll: islands</h1>
<div id="run">waiting for status.json</div>
<div id="error"></div>
<table>
<thead><tr><th>island</th><th>state</th><th>step</th><th>outer step</th><th>heartbeat age</th>
<th>last loss</th><th>bytes sent</th><th>restarts</th><th>member</th></tr></thead>
<tbody id="islands"></tbody>
</table>
<script>
"use strict";
function text(v, digits) {
  if (v === null || v === undefined) return "-";
  return typeof v === "number" && digits !== undefined ? v.toFixed(digits) : String(v);
}
function bytes(n) {
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; ++i; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}
function show(s) {
  const started = new Date(s.start_time * 1000).toISOString().replace("T", " ").slice(0, 19);
  document.getElementById("run").textContent =
    "run " + s.run_id + " in " + s.run_dir + ", started " + started + " UTC, " + s.state +
    (s.why ? " (" + s.why + ")" : "") + ", " + s.steps + " steps" +
    (s.epoch === null ? "" : ", membership epoch " + s.epoch) + (s.store_error ? ", store: " + s.store_error : "");
  const body = document.getElementById("islands");
  body.replaceChildren();
  for (const is of s.islands) {
    const tr = document.createElement("tr");
    const cells = [is.island, is.state, text(is.step), text(is.outer_step),
                   is.heartbeat_age_s === null ? "-" : is.heartbeat_age_s.toFixed(1) + " s",
                   text(is.last_loss, 4), bytes(is.bytes_sent), is.restarts, is.member ? "yes" : "no"];
    cells.forEach((c, k) => {
      const td = document.createElement("td");
      td.textContent = String(c);
      if (k === 1) td.className = "state " + is.state;
      tr.appendChild(td);
    });
    body.appendChild(tr);
  }
}
async function refresh() {
  try {
    const r = await fetch("status.json", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    show(await r.json());
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = "the launcher does not answer (" + e.message + "): the run has ended?";
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)atoll_page";
  return kPage;
}

}  // namespace atl
