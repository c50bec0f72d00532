#include "atoll/train/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include "atoll/core/file_writer.h"

namespace atl {

nlohmann::json to_json(const StepRow& r) {
  nlohmann::json row = {{"step", r.step},         {"tokens", r.tokens},           {"loss", r.loss},
                        {"aux_loss", r.aux_loss}, {"z_loss", r.z_loss},           {"lr", r.lr},
                        {"grad_norm", r.grad_norm}, {"batch_size", r.batch_size}, {"seq_len", r.seq_len}, {"tokens_per_s", r.tokens_per_s},
                        {"time_s", r.time_s}};
  auto put = [&](const char* key, const auto& field) {
    if (field) row[key] = *field;
  };
  put("mfu", r.mfu);
  put("val_loss", r.val_loss);
  if (!r.val_losses.empty()) row["val_losses"] = r.val_losses;
  for (const auto& [key, score] : r.task_scores) row[key] = score;
  put("island", r.island);
  put("rank", r.rank);
  put("comm_bytes", r.comm_bytes);
  put("comm_s", r.comm_s);
  put("compute_s", r.compute_s);
  put("idle_s", r.idle_s);
  put("overlap_comm_s", r.overlap_comm_s);
  put("ring_compute_s", r.ring_compute_s);
  put("ring_wait_s", r.ring_wait_s);
  put("ring_sync_s", r.ring_sync_s);
  put("outer_step", r.outer_step);
  put("fragment", r.fragment);
  put("theta_hash", r.theta_hash);
  put("round_steps", r.round_steps);
  put("round_tokens", r.round_tokens);
  put("round_weight", r.round_weight);
  put("momentum_hash", r.momentum_hash);
  auto put_list = [&](const char* key, const auto& field) {
    if (!field.empty()) row[key] = field;
  };
  put_list("load_layer", r.load_layer);
  put_list("load_entropy", r.load_entropy);
  put_list("load_max", r.load_max);
  put_list("load_min", r.load_min);
  put_list("load_skip", r.load_skip);
  put("ckpt_stall_s", r.ckpt_stall_s);
  put("ckpt_wait_s", r.ckpt_wait_s);
  put("ckpt_write_s", r.ckpt_write_s);
  put("ckpt_fence_s", r.ckpt_fence_s);
  return row;
}

bool is_eval_row(const nlohmann::json& row) {
  if (!row.is_object()) return false;
  if (row.contains("val_loss")) return true;
  for (const auto& [key, v] : row.items())
    if (key.starts_with("task/")) return true;
  return false;
}

namespace {
double wall_now_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }
}  // namespace

double run_start_wall_s(const std::string& run_dir) {
  std::ifstream in(run_dir + "/events.jsonl");
  std::string first;
  if (std::getline(in, first)) {
    const nlohmann::json row = nlohmann::json::parse(first, nullptr, /*allow_exceptions=*/false);
    if (row.is_object() && row.contains("time") && row["time"].is_number()) return row["time"].get<double>();
  }
  return wall_now_s();
}

double seconds_since_run_start() {
  const char* text = std::getenv("ATOLL_RUN_START");
  if (!text || !*text) return 0;
  char* end = nullptr;
  const double start = std::strtod(text, &end);
  const double since = wall_now_s() - start;
  return *end == '\0' && std::isfinite(since) && since >= 0 && since < 1e9 ? since : 0;
}

nlohmann::json event_row(const std::string& event, const nlohmann::json& fields) {
  const double now = wall_now_s();
  nlohmann::json row = {{"event", event}, {"time", now}};
  for (const auto& [k, v] : fields.items()) row[k] = v;
  return row;
}

void JsonlWriter::write(const nlohmann::json& row) {
  if (!file_.is_open()) return;
  const std::string line = row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  // One write(2) per line keeps lines from several processes whole (O_APPEND); a short one (a
  // disk filling up) is continued so that the error names the reason it stopped.
  file_.append(line.data(), line.size());
}

void truncate_jsonl_after_step(const std::string& path, int64_t max_step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_discarded()) continue;  // a line cut short by a kill
    if (row.contains("step") && row["step"].is_number_integer() && row["step"].get<int64_t>() > max_step) continue;
    kept += line + "\n";
  }
  write_file_atomic(path, kept);
}

}  // namespace atl
