// Where a run's metrics rows go: RUN_DIR/metrics.jsonl (the truth, train/metrics.h) and, for
// `tensorboard --logdir`, a TensorBoard event file under RUN_DIR/tb (core/tensorboard.h) with
// every numeric field of each row as a scalar at the row's step, flushed with the row.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "atoll/core/tensorboard.h"
#include "atoll/train/metrics.h"

namespace atl {

// The TensorBoard scalars of one metrics row. Tags are the field names; a row of a multi-island
// run puts them under "island<I>/" (and "island<I>/rank<R>/" for a rank other than 0), so each
// island is its own curve. A mixture's val_losses become "val_loss/<dataset>", the per-router
// load lists "load_entropy/layer<L>" (load_layer names the layers). "loss" comes first; step,
// island and rank are the record's coordinates, not scalars; strings are left out.
std::vector<TbScalar> tb_scalars_of_row(const nlohmann::json& row);

class MetricsLog {
 public:
  MetricsLog() = default;
  // Appends to run_dir/metrics.jsonl and writes a new event file in run_dir/tb.
  explicit MetricsLog(const std::string& run_dir);

  // One row to both; then, when the row carries an evaluation (val_loss), on_eval (the run's
  // report.html is rewritten there).
  void write(const nlohmann::json& row);
  std::function<void()> on_eval;

 private:
  JsonlWriter jsonl_;
  TbWriter tb_;
};

}  // namespace atl
