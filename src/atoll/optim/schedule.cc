#include "atoll/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "atoll/core/check.h"

namespace atl {

double lr_at(const OptimConfig& cfg, int64_t step, int64_t total_steps) {
  ATOLL_CHECK_GE(step, 0);
  ATOLL_CHECK_GT(total_steps, 0);
  ATOLL_CHECK(cfg.schedule == "cosine" || cfg.schedule == "wsd" || cfg.schedule == "constant")
      << "unknown optim.schedule '" << cfg.schedule << "' (cosine | wsd | constant)";
  const double lr = cfg.lr, lr_min = cfg.lr * cfg.min_lr_ratio;
  // Warmup counts the step being taken, so the first step has a non-zero rate and the last
  // warmup step reaches lr.
  if (step < cfg.warmup_steps) return lr * double(step + 1) / double(cfg.warmup_steps);
  if (cfg.schedule == "constant") return lr;
  if (cfg.schedule == "cosine") {
    // Progress (0, 1] over the steps after warmup, by the same "counting this step" rule.
    const int64_t span = total_steps - cfg.warmup_steps;
    const double p = span > 0 ? std::min(1.0, double(step - cfg.warmup_steps + 1) / double(span)) : 1.0;
    return lr_min + 0.5 * (lr - lr_min) * (1.0 + std::cos(M_PI * p));
  }
  // wsd: a plateau at lr, then the final `decay` steps.
  const int64_t decay = std::clamp<int64_t>(std::llround(cfg.decay_frac * double(total_steps)), 0, total_steps);
  const int64_t start = total_steps - decay;  // first decaying step
  if (step < start || decay == 0) return lr;
  const double p = std::min(1.0, double(step - start + 1) / double(decay));
  return lr - (lr - lr_min) * p;
}

int batch_at(const TrainConfig& cfg, int64_t tokens_seen, int seq_len) {
  ATOLL_CHECK_GT(seq_len, 0);
  ATOLL_CHECK_GE(tokens_seen, 0);
  if (cfg.batch_ramp_start == 0 || cfg.batch_ramp_tokens == 0) return cfg.batch_size;
  if (tokens_seen >= cfg.batch_ramp_tokens) return cfg.batch_size;
  const int micro = cfg.micro_batch_size ? cfg.micro_batch_size : cfg.batch_size;
  ATOLL_CHECK_GT(micro, 0);
  // Integer arithmetic: (batch_size - start) * tokens stays far inside int64 for any run.
  const int64_t grow = int64_t(cfg.batch_size - cfg.batch_ramp_start) * tokens_seen / cfg.batch_ramp_tokens;
  const int64_t b = cfg.batch_ramp_start + grow;
  return int(std::max<int64_t>(micro, b / micro * micro));
}

}  // namespace atl
