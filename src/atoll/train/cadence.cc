#include "atoll/train/cadence.h"

namespace atl {

CadenceOptions cadence_options(const Config& cfg, int64_t stop_after) {
  return {.steps = cfg.train.steps,
          .eval_every = cfg.train.eval_every,
          .checkpoint_every = cfg.checkpoint.every,
          .log_every = cfg.train.log_every,
          .stop_after = stop_after};
}

Cadence::Cadence(const CadenceOptions& opts, int64_t step) : opts_(opts), before_(step), agreed_at_(step) {}

void Cadence::start_step(int64_t step, bool agreed) {
  before_ = step;
  if (agreed) agreed_at_ = step;
}

bool Cadence::evaluates(int64_t step) const {
  return opts_.eval_every > 0 && (crossed(opts_.eval_every, before_, step) || last(step));
}

StepEnd Cadence::end_step(int64_t step, const CadenceQuestions& ask) {
  const bool is_last = last(step);
  const bool stopping = !is_last && ask.stop_requested();
  // Checkpoints fall due only where every island holds this step: counted from the last such
  // point, a jump of the step counter in between does not skip a multiple of checkpoint.every.
  const bool agreed = ask.steps_agreed();
  if (agreed) {
    due_ = due_ || crossed(opts_.checkpoint_every, agreed_at_, step) || is_last || stopping;
    agreed_at_ = step;
  }
  StepEnd end;
  if (due_ && ask.can_checkpoint()) end.checkpoint = true, due_ = false, saved_ = true;
  if (stopping && agreed && !due_) {  // its checkpoint written: the run may resume from this step
    end.stop = end.stopped = true;
  } else if (opts_.stop_after > 0 && step >= opts_.stop_after) {
    end.stop = true;
  }
  return end;
}

bool Cadence::row_due(int64_t step, bool notable) const { return step % opts_.log_every == 0 || last(step) || notable; }

}  // namespace atl
