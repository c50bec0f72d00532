#include "atoll/train/driver.h"

#include <cmath>
#include <cstdio>
#include <optional>

#include "atoll/core/timer.h"
#include "atoll/optim/bias_balance.h"
#include "atoll/train/bench.h"
#include "atoll/train/cadence.h"
#include "atoll/train/step.h"

namespace atl {
namespace {

// The validation loss of this step into its row (and each dataset's, for a mixture), noted on
// the progress line.
double validate_into(StepRow& row, Loop& loop, Progress* progress) {
  row.val_loss = loop.validate();
  for (size_t i = 0; loop.train_data.mixes() && i < loop.val_losses.size(); ++i)
    if (!std::isnan(loop.val_losses[i])) row.val_losses[loop.train_data.dirs()[i]] = loop.val_losses[i];
  if (progress) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "step %ld: val_loss %.4f", long(loop.step), *row.val_loss);
    progress->note(buf);
  }
  return *row.val_loss;
}

// The scores of train.eval_tasks at this step into its row (task_eval.h), noted on the progress line.
void score_tasks_into(StepRow& row, Loop& loop, Progress* progress) {
  std::string note = "step " + std::to_string(loop.step) + ":";
  for (const TaskScores& s : loop.score_tasks()) {
    row.task_scores["task/" + s.name + "/acc"] = s.acc;
    row.task_scores["task/" + s.name + "/acc_norm"] = s.acc_norm;
    char buf[64];
    std::snprintf(buf, sizeof buf, " acc %.3f", s.acc);
    note += " " + s.name + buf;
  }
  if (progress) progress->note(note);
}

// A save's cost to the step that started it, in its row.
void add_save_cost(StepRow& row, const SaveReport& cost) {
  row.ckpt_stall_s = cost.stall_s;
  if (cost.wait_s > 0) row.ckpt_wait_s = cost.wait_s;
  row.ckpt_write_s = cost.write_s;
}

}  // namespace

DriverResult run_steps(Loop& loop, StepHooks& hooks, const DriverOptions& opts) {
  const Config& cfg = loop.cfg;
  const double t_start = opts.t_start != 0 ? opts.t_start : now_s();
  DriverResult result;
  StepState state{.balanced = balanced_rows(loop.engine->layout())};
  Cadence cadence(cadence_options(cfg, opts.stop_after), loop.step);
  const CadenceQuestions ask{.stop_requested = [&] { return opts.stop_requested && opts.stop_requested(); },
                             .steps_agreed = [&] { return hooks.steps_agreed(); },
                             .can_checkpoint = [&] { return hooks.can_checkpoint(); }};
  while (cadence.more(loop.step)) {
    hooks.before_step(loop);  // a joiner's admission may set loop.step
    cadence.start_step(loop.step, hooks.steps_agreed());
    const double t0 = now_s();
    std::optional<StepRow> row = train_step(loop, hooks, opts, state);
    if (!row) continue;  // rolled back: the batch is skipped
    hooks.after_inner_step(loop, *row, state.clocks);
    row->tokens_per_s = double(row->batch_size) * cfg.model.seq_len * opts.workers / (now_s() - t0);
    if (opts.peak_gflops > 0)
      row->mfu = mfu_of(cfg.model, row->tokens_per_s, opts.devices > 0 ? opts.devices : opts.workers, opts.peak_gflops);
    if (opts.evaluates() && loop.has_val() && cadence.evaluates(loop.step))
      result.final_val_loss = validate_into(*row, loop, opts.progress);
    if (opts.evaluates() && !loop.tasks.empty() && cadence.evaluates(loop.step)) score_tasks_into(*row, loop, opts.progress);
    hooks.finish_row(*row, state.clocks);
    row->time_s = now_s() - t_start;
    if (loop.step == 1 || result.first_loss == 0) result.first_loss = row->loss;
    result.final_loss = row->loss;
    const StepEnd end = cadence.end_step(loop.step, ask);
    if (end.checkpoint) add_save_cost(*row, opts.save());
    if (cadence.row_due(loop.step, row->val_loss || !row->task_scores.empty() || row->theta_hash || row->ckpt_stall_s ||
                                       row->ckpt_fence_s))
      opts.write_row(to_json(*row));
    if (opts.progress) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "loss %.4f | lr %.2e | %.0f tok/s", row->loss, row->lr, row->tokens_per_s);
      opts.progress->update(loop.step, buf);
    }
    if (end.stop) {
      result.stopped = end.stopped;
      break;
    }
  }
  if (opts.progress) opts.progress->finish();
  if (cadence.final_save()) opts.save();
  result.checkpoint = opts.finish_saves();  // the final save is waited for
  return result;
}

}  // namespace atl
