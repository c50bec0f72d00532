// The training loop of one process: batches from the loader, forward/backward with gradient
// accumulation, clipping, the learning-rate schedule and the optimizer step; validation,
// metrics, progress and checkpoints at their intervals; exact resume from a checkpoint.
//
// train() holds the run directory's lock from before it writes anything there until it returns
// (run_dir.h, run_lock.h), and writes summary.txt last. With TrainOptions::stop_on_signal, Ctrl-C
// or SIGTERM stops the run after the current step with a checkpoint of it (stop_signals.h); the
// result then names the signal.
#pragma once

#include <cstdint>
#include <string>

#include "atoll/config/config.h"

namespace atl {

struct TrainOptions {
  std::string run_dir;   // "" = default_run_dir()
  bool resume = false;   // continue the run in run_dir from its newest checkpoint (run_dir.h)
  bool allow_config_change = false;  // resume with keys changed beyond kResumeSafeKeys
  bool quiet = false;    // no progress output (tests)
  int64_t stop_after = 0;  // > 0: return after this step, as if interrupted (tests, time-boxed jobs)
  bool stop_on_signal = false;  // SIGINT/SIGTERM stop the run with a checkpoint (`atoll train`)
  // A new run's weights from this Hugging Face folder (ckpt/import_hf.h), whose config.json the
  // caller already made cfg.model; its tokenizer.model must be the data's. "" = drawn from the seed.
  std::string init_from{};
};

struct TrainResult {
  std::string run_dir;
  std::string checkpoint;  // the final checkpoint (the interrupted step's when stopped by a signal)
  std::string tokenizer_path;
  int64_t steps = 0;
  int64_t tokens = 0;
  double first_loss = 0, final_loss = 0, final_val_loss = -1;
  double seconds = 0;
  int stopped_by = 0;      // the signal that stopped the run, 0 when it ran to its last step
  std::string summary;     // what summary.txt holds: a few lines on the run
};

TrainResult train(const Config& cfg, const TrainOptions& opts);

// One line on what a run will do, printed at its start instead of the whole config:
// "68.0k-parameter MoE (L 2, C 32, E 4 top-2, V 384, T 32), adamw lr 0.003 cosine, 300 steps x
// 8 sequences, fp32 on cpu, run runs/x".
std::string describe_run(const Config& cfg, const std::string& run_dir);

// Sets the thread count of OpenMP and the BLAS (0 = all cores); returns the count used.
int configure_threads(int threads);

}  // namespace atl
