// Where a run's metrics rows go: RUN_DIR/metrics.jsonl (the truth, train/metrics.h) and, for
// `tensorboard --logdir`, a TensorBoard event file under RUN_DIR/tb (core/tensorboard.h) with
// every numeric field of each row as a scalar at the row's step, flushed with the row.
#pragma once

#include <functional>
#include <map>
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

// The rows of each island go to an event file of their own in RUN_DIR/tb, named
// events.out.tfevents.<seconds>.<host>.<pid>.island<I> (no suffix for a single-process run), all
// with the seconds of the log's start, so the files sort by island; TensorBoard reads the folder
// as one run.
class MetricsLog {
 public:
  MetricsLog() = default;
  // Appends to run_dir/metrics.jsonl; the event files are created in run_dir/tb with the first
  // row of each island.
  explicit MetricsLog(const std::string& run_dir);

  // One row to both; then, when the row carries an evaluation (val_loss or a task score), on_eval (the run's
  // report.html is rewritten there).
  void write(const nlohmann::json& row);
  std::function<void()> on_eval;

 private:
  std::string tb_dir_;
  double created_ = 0;
  JsonlWriter jsonl_;
  std::map<int64_t, TbWriter> tb_;  // by island; -1: rows without one
};

}  // namespace atl
