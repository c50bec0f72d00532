// Learning-rate and batch-size schedules, pure functions of the step or token count so that a
// resumed run recomputes them rather than storing them.
#pragma once

#include <cstdint>

#include "atoll/config/config.h"

namespace atl {

// The learning rate for the step about to be taken (`step` is 0-based, of `total_steps`).
// Warmup: lr*(step+1)/warmup_steps for step < warmup_steps. After it, by cfg.schedule:
//  - constant: lr.
//  - cosine: lr_min + (lr - lr_min)*(1 + cos(pi*p))/2, p = (step - warmup + 1)/(total - warmup),
//    so the last step takes lr_min = lr*min_lr_ratio.
//  - wsd (warmup-stable-decay): lr, then over the final D = round(decay_frac*total) steps a
//    linear decay whose i-th step (0-based) takes lr - (lr - lr_min)*(i+1)/D, lr_min last.
// Steps past the end keep lr_min.
double lr_at(const OptimConfig& cfg, int64_t step, int64_t total_steps);

// Sequences per optimizer step after `tokens_seen` tokens. Without a ramp (batch_ramp_start
// or batch_ramp_tokens 0) this is batch_size. With one, it grows linearly from
// batch_ramp_start to batch_size as tokens_seen goes from 0 to batch_ramp_tokens, rounded down
// to a whole number of micro-batches (at least one), and is batch_size from then on.
// seq_len is the tokens per sequence (checked only: the ramp is measured in tokens already).
int batch_at(const TrainConfig& cfg, int64_t tokens_seen, int seq_len);

}  // namespace atl
