// metrics.jsonl and events.jsonl (DESIGN.md "Files"): one JSON object per line, each line
// written with a single append so lines from several processes never interleave.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "atoll/core/file_writer.h"

namespace atl {

class JsonlWriter {
 public:
  JsonlWriter() = default;
  explicit JsonlWriter(const std::string& path) : file_(path) {}  // opens for appending, creating it

  void write(const nlohmann::json& row);  // one line, one write(2)
  const std::string& path() const { return file_.path(); }

 private:
  AppendFile file_;
};

// One metrics.jsonl row: every field a run logs per step, declared here once (DESIGN.md
// "Files"); to_json writes the fields that are set. The driver fills the first group; a
// multi-island run adds the second (cumulative seconds and bytes of this process) and, at an
// outer step, the third. A model with zaya routers adds the fourth: per router, in layer order,
// the experts' load this step (optim/bias_balance.h RouterLoad): its layer, the normalised
// entropy H(p)/ln E, the largest and smallest expert share, and the share of slots that skipped;
// a step that starts a checkpoint save, the fifth.
struct StepRow {
  int64_t step = 0, tokens = 0;
  double loss = 0, aux_loss = 0, z_loss = 0, lr = 0, grad_norm = 0;
  int batch_size = 0;
  int seq_len = 0;  // model.seq_len in force at this step (data.phases may change it)
  double tokens_per_s = 0, time_s = 0;
  std::optional<double> mfu{};  // with train.peak_gflops: bench.h mfu_of(tokens_per_s) over the step's workers
  std::optional<double> val_loss{};
  std::map<std::string, double> val_losses{};  // a mixture's: each evaluated dataset's (dir -> loss)
  // train.eval_tasks at an evaluation: "task/<name>/acc" and "task/<name>/acc_norm" -> score,
  // written as fields of their own (train/task_eval.h).
  std::map<std::string, double> task_scores{};

  std::optional<int> island{}, rank{};
  std::optional<uint64_t> comm_bytes{};
  std::optional<double> comm_s{}, compute_s{}, idle_s{}, overlap_comm_s{};
  // Context parallelism (train.context_parallel > 1): this process's cumulative seconds in ring
  // attention computing blocks, and blocked waiting for ring transfers (model/ring_attention.h);
  // ring_sync_s only under the bench switch ATOLL_RING_SYNC=1.
  std::optional<double> ring_compute_s{}, ring_wait_s{}, ring_sync_s{};

  std::optional<int64_t> outer_step{};
  std::optional<int> fragment{};
  std::optional<std::string> theta_hash{}, momentum_hash{};
  // Islands on a time budget (diloco.sync_seconds), at an outer step: this island's inner steps
  // and tokens in the round, and the token weight its Δ got in the mean (dist/update_guard.h).
  std::optional<int64_t> round_steps{}, round_tokens{};
  std::optional<double> round_weight{};

  std::vector<int> load_layer{};
  std::vector<double> load_entropy{}, load_max{}, load_min{}, load_skip{};
  // A row whose step started a checkpoint save: seconds the step was blocked by it (the plan
  // and the small values, plus any wait for the previous save: ckpt_wait_s), and the background
  // write time of the newest save this process completed (absent before the first). The row of
  // the next step: ckpt_fence_s, seconds it waited at its fence for that save's copy of the
  // saved tensors (state_checkpoint.h Checkpointer::fence). A save's stall is the sum of the two.
  std::optional<double> ckpt_stall_s{}, ckpt_wait_s{}, ckpt_write_s{}, ckpt_fence_s{};
};
nlohmann::json to_json(const StepRow& r);

// Whether a metrics row carries an evaluation: val_loss or a task score (task/...).
bool is_eval_row(const nlohmann::json& row);

// One events.jsonl object: {"event": name, "time": wall-clock seconds since 1970 (UTC)} and `fields`.
nlohmann::json event_row(const std::string& event, const nlohmann::json& fields = nlohmann::json::object());

// The wall-clock second (events' "time") a launched run started: the first event of
// RUN_DIR/events.jsonl (a resumed run keeps its own), else now. `atoll launch` passes it to its
// workers as ATOLL_RUN_START, so every worker's time_s counts from it: a restarted worker's rows
// continue its island's time instead of starting again from 0.
double run_start_wall_s(const std::string& run_dir);
// Seconds since ATOLL_RUN_START; 0 where it is unset or unreadable (a worker started by hand
// counts from its own start).
double seconds_since_run_start();

// Keeps only the lines of a JSONL file whose "step" is at most max_step (and lines without a
// step), rewriting it through a temporary file: a resumed run drops what the killed run logged
// after its last checkpoint, so the file reads as one uninterrupted run.
void truncate_jsonl_after_step(const std::string& path, int64_t max_step);

}  // namespace atl
