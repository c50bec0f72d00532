// `atoll report`: one self-contained HTML page of a run (docs/report.md), made from the run
// folder's metrics.jsonl, events.jsonl, config.toml and summary.txt. The data is embedded as
// JSON; the charts are drawn in the browser by uPlot, inlined from train/report_assets.h, so
// the page makes no network request of any kind.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace atl {

// One run as the page reads it: {"name", "dir", "rows": [metrics rows], "events": [...],
// "config": text, "summary": text, "notes": [what could not be read, and how it was taken]}.
// Damaged input becomes notes (a missing or empty metrics.jsonl, lines that are not JSON such
// as a last line cut short by a kill, fields the page does not chart); a folder that holds none
// of the four files is a ConfigError naming it.
nlohmann::json load_report_run(const std::string& run_dir);

// The page of `runs` (the first is the run, the others are overlaid by --compare).
std::string report_html(const std::vector<nlohmann::json>& runs);

// Rewrites RUN_DIR/report.html (through a temporary file and a rename) from the run's files;
// called at each evaluation and at the end of `atoll train` and `atoll launch`. A failure is
// logged as a warning and never stops the run.
void write_run_report(const std::string& run_dir);

}  // namespace atl
