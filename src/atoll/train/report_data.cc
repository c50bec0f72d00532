// Reading a run folder for the report page (train/report.h load_report_run).
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "atoll/core/errors.h"
#include "atoll/train/report.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

// The fields the page charts or shows (train/metrics.h StepRow); others are listed in a note.
const std::set<std::string> kKnownFields = {
    "step", "tokens", "loss", "aux_loss", "z_loss", "lr", "grad_norm", "batch_size", "seq_len", "tokens_per_s", "time_s",
    "val_loss", "val_losses", "island", "rank", "comm_bytes", "comm_s", "compute_s", "idle_s", "overlap_comm_s",
    "outer_step", "fragment", "theta_hash", "momentum_hash", "round_steps", "round_tokens", "round_weight",
    "load_layer", "load_entropy", "load_max", "load_min", "load_skip", "ckpt_stall_s", "ckpt_wait_s",
    "ckpt_write_s", "ckpt_fence_s", "mfu"};

std::string read_text(const std::string& path, bool* found) {
  std::ifstream in(path, std::ios::binary);
  *found = bool(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The JSON objects of a JSONL file; each line that is not one becomes a note (its number), the
// last line cut short by a kill among them.
nlohmann::json read_jsonl_rows(const std::string& path, const std::string& name, nlohmann::json& notes, bool* found) {
  nlohmann::json rows = nlohmann::json::array();
  const std::string text = read_text(path, found);
  if (!*found) return rows;
  std::istringstream in(text);
  std::string line;
  int64_t n = 0, bad = 0, first_bad = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.is_object()) {
      if (bad++ == 0) first_bad = n;
      continue;
    }
    rows.push_back(std::move(row));
  }
  if (bad > 0)
    notes.push_back(name + ": " + std::to_string(bad) + " line(s) are not JSON objects and were skipped (first: line " +
                    std::to_string(first_bad) + (first_bad == n ? ", the last, cut short?" : "") + ")");
  return rows;
}

}  // namespace

nlohmann::json load_report_run(const std::string& run_dir) {
  nlohmann::json run = {{"dir", run_dir}, {"notes", nlohmann::json::array()}};
  const fs::path p = fs::path(run_dir).lexically_normal();
  run["name"] = (p.has_filename() ? p.filename() : p.parent_path().filename()).string();
  nlohmann::json& notes = run["notes"];
  bool has_metrics = false, has_events = false, has_config = false, has_summary = false;
  run["rows"] = read_jsonl_rows(run_dir + "/metrics.jsonl", "metrics.jsonl", notes, &has_metrics);
  run["events"] = read_jsonl_rows(run_dir + "/events.jsonl", "events.jsonl", notes, &has_events);
  run["config"] = read_text(run_dir + "/config.toml", &has_config);
  run["summary"] = read_text(run_dir + "/summary.txt", &has_summary);
  if (!has_metrics && !has_events && !has_config && !has_summary)
    throw ConfigError(run_dir + " is not a run directory (no metrics.jsonl, events.jsonl, config.toml or summary.txt); "
                      "fix: pass the --run-dir of an `atoll train` or `atoll launch` run");
  if (!has_metrics)
    notes.push_back("no metrics.jsonl: the run logged no step (yet); the charts are empty");
  else if (run["rows"].empty())
    notes.push_back("metrics.jsonl has no rows: the run logged no step (yet); the charts are empty");
  if (!has_events) notes.push_back("no events.jsonl: the timeline has no incidents");
  std::set<std::string> unknown;
  bool without_tokens = false;
  for (const auto& row : run["rows"]) {
    for (const auto& [k, v] : row.items())
      if (!kKnownFields.count(k) && !k.starts_with("task/")) unknown.insert(k);  // task/<name>/acc: train.eval_tasks
    without_tokens |= row.contains("loss") && !row.contains("tokens");
  }
  if (!unknown.empty()) {
    std::string list;
    for (const auto& k : unknown) list += (list.empty() ? "" : ", ") + k;
    notes.push_back("fields this page does not chart (a newer or other format?): " + list);
  }
  if (without_tokens) notes.push_back("rows without tokens (an older run format): the loss is drawn against the step");
  return run;
}

}  // namespace atl
