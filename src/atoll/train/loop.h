// What one training process holds: the engine (parameters, gradients, optimizer state, where the
// step runs; engine/engine.h), this worker's slice of the training data and the validation
// split, and the counters. The driver (driver.h) runs the steps; this file feeds the engine its
// token batches: one batch's gradients with accumulation over micro-batches, and validation.
// What a checkpoint holds of it is declared in the state registry (state_registry.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/data/mixture_loader.h"
#include "atoll/engine/engine.h"
#include "atoll/train/task_eval.h"

namespace atl {

struct LoopOptions {
  int worker = 0, n_workers = 1;  // this worker reads slice `worker` of `n_workers` (loader.h)
  int device_index = -1;          // EngineOptions::device_index
  int island_rank = 0, island_size = 1;  // EngineOptions: this worker's place in its island (ZeRO-1)
};

struct Loop {
  // The data first (its errors name the file and the fix), then the engine (make_engine). The
  // data is `data_dir`, or the datasets of data.mix / data.phases when the config has them.
  Loop(const Config& c, const std::string& data_dir, const LoopOptions& opts = {});

  const Config run_cfg;  // the run's config as given
  // The config in force: run_cfg with the current data phase's model.seq_len, model.rope_theta
  // and train.batch_size (data.phases; config_in_phase). Everything a step reads, reads this.
  Config cfg;
  MixtureLoader train_data;
  // Each dataset's validation split, as train_data.dirs() (null: that dataset has none).
  std::vector<std::unique_ptr<DataLoader>> val_data;
  std::vector<double> val_losses;  // each dataset's loss at the last validate() (NaN: not measured)
  // train.eval_tasks, read and tokenised (with the data's tokenizer.model) before the run starts.
  std::vector<TaskSet> tasks;
  // Called with the data_phase event's fields when a phase of data.phases starts.
  std::function<void(const nlohmann::json&)> on_data_phase;
  std::unique_ptr<Engine> engine;
  int64_t step = 0, tokens = 0;
  std::vector<int32_t> in, tg;  // [micro_batch, T] inputs and targets
  Collective* cp = nullptr;     // the context-parallel group, or null
  std::vector<int32_t> cp_in, cp_tg;  // [micro_batch, T_r] this rank's rows of in and tg

  // The phase change hook, before each step's batch: enters the data phase `tokens` have
  // reached, and when its settings differ from those in force (a phase that starts now, or the
  // phase a resumed run's data cursor is in), puts them in force: the loader re-chunks, the
  // engine rebuilds its buffers and RoPE tables (Engine::set_sequence), the validation data
  // follows. A phase that starts calls on_data_phase, its fields naming the old and new values.
  void enter_phase();
  // zero grads, then forward/backward over batch / micro_batch micro-batches of the next
  // `batch` training windows: the gradients hold the batch mean. Returns the mean loss.
  // Under context parallelism this rank's gradients are its share of the group's batch times P
  // (so that the island's mean over M = P·D workers is the mean over the D groups' batches),
  // and the loss returned is the group's: the same figure on every rank of it.
  LossParts gradients(int batch);
  // Context parallelism (train.context_parallel, docs/long_context.md): every rank of `group`
  // reads the same windows (the caller gives them one data slice) and trains on its zigzag
  // rows of them (model/ring_attention.h). Validation and task scores stay on whole sequences
  // on the one worker that evaluates. Null: whole sequences.
  void set_context_parallel(Collective* group);
  bool has_val() const;
  // Throws DataError naming a shard of the training or validation data that failed its
  // meta.json checksum; with `wait`, once every shard has been checked (data/shard_verifier.h).
  void check_data(bool wait) const;
  // Mean cross-entropy over the first train.eval_batches micro-batches of each dataset's
  // validation split (one must exist), where the step runs; for a mixture, the mean of the
  // datasets' losses weighted by the current phase's shares.
  double validate();
  // Each of `tasks` scored where the step runs (task_eval.h), micro_batch sequences per pass.
  std::vector<TaskScores> score_tasks();

 private:
  void open_val_data();  // each dataset's validation split at cfg.model.seq_len
};

}  // namespace atl
