// One step of training, as llm.c's train_gpt2.c takes it: the batch's gradients (zero grads,
// forward, backward over its micro-batches: loop.h), the hooks' means, the update. What happens
// around the steps (evaluation, checkpoints, rows, the end of the run) is the cadence's
// (cadence.h); driver.h run_steps composes the two.
//
// In order: the batch size at this point of the run (optim/schedule.h batch_at), the batch's
// gradients, hooks.after_gradients (the in-island mean, the warm start's mean across islands:
// its time counts as communication), the fence of the save in flight, hooks.keep_batch (false:
// the batch is skipped, rolled back by the hook), the NaN check (a non-finite loss ends the run,
// naming the step and the fix), clipping at optim.grad_clip, the optimizer step at lr_at(step),
// the router loads of the row, and the counters: loop.step counts the step, loop.tokens every
// worker's batch (so the batch ramp and the learning rate read global figures).
//
// The save in flight (state_checkpoint.h) copies the saved tensors in the background while the
// batch's passes read them; the step waits at its fence (opts.fence, after hooks.after_gradients,
// which write gradients only) before anything writes them: a rollback, the optimizer step, the
// outer steps. The wait is reported in the next row the step makes (ckpt_fence_s).
#pragma once

#include <optional>
#include <vector>

#include "atoll/model/layout.h"
#include "atoll/train/driver.h"
#include "atoll/train/loop.h"
#include "atoll/train/metrics.h"

namespace atl {

// What one step hands the next.
struct StepState {
  StepClocks clocks{};
  std::optional<double> fenced{};             // the fence's wait, until a row reports it
  std::vector<const ParamEntry*> balanced{};  // zaya routers' bias rows (optim/bias_balance.h)
};

// One step from loop.step: its row (step, tokens, losses, lr, grad_norm, batch_size, router loads,
// ckpt_fence_s), or nullopt when hooks.keep_batch skipped the batch (the step does not count).
std::optional<StepRow> train_step(Loop& loop, StepHooks& hooks, const DriverOptions& opts, StepState& state);

}  // namespace atl
