// The cadence of a run: around each step (step.h train_step), which step evaluates, saves a
// checkpoint, writes its metrics row and ends the run (driver.h run_steps composes the two). It
// decides from step numbers and the hooks' answers only, so it is tested without an engine
// (tests/train/cadence_test.cc).
//
// Validation runs when the step crosses a multiple of train.eval_every, and at the last step
// (train.eval_every = 0: never). A checkpoint falls due at a multiple of checkpoint.every, at the
// last step, and when a stop is requested; it is written once hooks.can_checkpoint() allows it
// (false delays it: an exchange in flight), and the run saves one at its end if it wrote none. A
// metrics row is written every train.log_every steps, at the last, and at rows the driver finds
// notable (with val_loss, task scores, theta_hash or a checkpoint's figures). A stop request ends the run at
// the first step where the steps agree (below), once that step's checkpoint is written (the run
// may resume from it); `stop_after` (a test's) ends it after that step without one.
//
// A hook may move the step counter ahead by more than one (islands on a time budget,
// diloco.sync_seconds, adopt the round's furthest step at a commit): validation then runs when the
// step crossed a multiple of train.eval_every during the step, and a checkpoint falls due only
// where every island holds the same step (hooks.steps_agreed: right after a committed outer step),
// when the step crossed a multiple of checkpoint.every since the last such point. With steps of
// one and agreement everywhere, both are step % every == 0.
#pragma once

#include <cstdint>
#include <functional>

#include "atoll/config/config.h"

namespace atl {

struct CadenceOptions {
  int64_t steps = 0;             // train.steps: the last step
  int64_t eval_every = 0;        // train.eval_every (0: never)
  int64_t checkpoint_every = 0;  // checkpoint.every (0: at the last step and a stop only)
  int64_t log_every = 1;         // train.log_every (>= 1)
  int64_t stop_after = 0;        // > 0: the run returns after this step, as if interrupted
};
CadenceOptions cadence_options(const Config& cfg, int64_t stop_after);

// What the cadence asks the run at the end of a step, each only where the answer matters, in
// this order: stop_requested after every step but the last, steps_agreed after every step,
// can_checkpoint while a checkpoint is due.
struct CadenceQuestions {
  std::function<bool()> stop_requested;
  std::function<bool()> steps_agreed;
  std::function<bool()> can_checkpoint;
};

// What the end of a step does, in order: the checkpoint, the row, then the stop.
struct StepEnd {
  bool checkpoint = false;  // save a checkpoint of this step now
  bool stop = false;        // return after this step's row
  bool stopped = false;     // ... because a stop was requested (its checkpoint written)
};

class Cadence {
 public:
  // `step`: the steps done when the run (or its resume) starts.
  Cadence(const CadenceOptions& opts, int64_t step);

  // Whether another step runs from `step`.
  bool more(int64_t step) const { return step < opts_.steps; }
  // Before a step's batch, once its hooks.before_step ran (a joiner's admission may set the step):
  // the step the batch starts from, and hooks.steps_agreed() there.
  void start_step(int64_t step, bool agreed);
  // After the step (and its hooks, which may have moved the counter): the run's last step?
  bool last(int64_t step) const { return step == opts_.steps; }
  // ... and does it validate (where this process evaluates and has a validation split)?
  bool evaluates(int64_t step) const;
  // Once the step's row is complete but for the checkpoint: what to do (see StepEnd).
  StepEnd end_step(int64_t step, const CadenceQuestions& ask);
  // Whether the step's row is written; `notable`: it holds val_loss, task scores, theta_hash or a save's figures.
  bool row_due(int64_t step, bool notable) const;
  // Whether the run's end must save a checkpoint: it wrote none.
  bool final_save() const { return !saved_; }

 private:
  // Whether the step count crossed a multiple of `every` from `from` to `step`.
  static bool crossed(int64_t every, int64_t from, int64_t step) { return every > 0 && step / every > from / every; }

  CadenceOptions opts_;
  int64_t before_ = 0;     // the step the current batch started from
  int64_t agreed_at_ = 0;  // the step at the last point where every island held the same step
  bool due_ = false;       // a checkpoint is due and not yet written
  bool saved_ = false;     // a checkpoint was written
};

}  // namespace atl
