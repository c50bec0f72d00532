// The training loop of one process: batches from the loader, forward/backward with gradient
// accumulation, clipping, the learning-rate schedule and the optimizer step; validation,
// metrics, progress and checkpoints at their intervals; exact resume from a checkpoint.
#pragma once

#include <cstdint>
#include <string>

#include "atoll/config/config.h"

namespace atl {

struct TrainOptions {
  std::string run_dir;   // "" = default_run_dir()
  bool resume = false;   // continue the run in run_dir from its newest checkpoint
  bool quiet = false;    // no progress output (tests)
  int64_t stop_after = 0;  // > 0: return after this step, as if interrupted (tests, time-boxed jobs)
};

struct TrainResult {
  std::string run_dir;
  std::string checkpoint;  // the final checkpoint
  std::string tokenizer_path;
  int64_t steps = 0;
  int64_t tokens = 0;
  double first_loss = 0, final_loss = 0, final_val_loss = -1;
  double seconds = 0;
};

TrainResult train(const Config& cfg, const TrainOptions& opts);

// Sets the thread count of OpenMP and the BLAS (0 = all cores); returns the count used.
int configure_threads(int threads);

}  // namespace atl
