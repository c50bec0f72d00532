#include "atoll/train/driver.h"

#include <cmath>
#include <cstdio>
#include <utility>

#include "atoll/core/errors.h"
#include "atoll/core/timer.h"
#include "atoll/optim/bias_balance.h"
#include "atoll/optim/schedule.h"

namespace atl {
namespace {

// A non-finite loss ends the run; the message names the step and the fix.
[[noreturn]] void fail_on_loss(const LossParts& loss, int64_t step, const std::string& who) {
  const std::string what = "loss is " + std::to_string(loss.total()) + " at step " + std::to_string(step) +
                           "; fix: lower optim.lr or raise optim.warmup_steps";
  if (who.empty()) throw Error(what + " (checkpoints so far are intact)");
  throw Error(who + ": " + what);
}

// Each router's expert load this step, in layer order: a zaya router's from the loads it left in
// the gradient slots of its balancing biases (optim/bias_balance.h; island-wide, read on the host
// copy), a softmax router's from this worker's choices (Engine::topk_choice_counts).
void add_router_loads(StepRow& row, Engine& engine, const ModelConfig& m, const std::vector<const ParamEntry*>& rows) {
  const std::vector<double> counts = engine.topk_choice_counts();
  if (!rows.empty()) engine.grad_rows_to_host(rows);
  auto balanced = rows.begin();
  for (int l = 0; l < m.n_layers; ++l) {
    RouterLoad load;
    if (balanced != rows.end() && (*balanced)->layer == l) {
      load = router_load(engine.host().grads, **balanced++);
    } else if (m.router_at(l) == "topk" && !counts.empty()) {
      load = router_load_from_counts(l, counts.data() + size_t(l) * m.n_experts, m.n_experts);
    } else {
      continue;
    }
    row.load_layer.push_back(load.layer), row.load_entropy.push_back(load.entropy);
    row.load_max.push_back(load.max_load), row.load_min.push_back(load.min_load);
    row.load_skip.push_back(load.skip_share);
  }
}

}  // namespace

DriverResult run_steps(Loop& loop, StepHooks& hooks, const DriverOptions& opts) {
  const Config& cfg = loop.cfg;
  const int T = cfg.model.seq_len;
  const double t_start = opts.t_start > 0 ? opts.t_start : now_s();
  Engine& engine = *loop.engine;
  DriverResult result;
  StepClocks clocks;
  bool saved = false, checkpoint_due = false;
  std::optional<double> fenced;  // the fence's wait for the last save's copy, until a row reports it
  const std::vector<const ParamEntry*> balanced = balanced_rows(engine.layout());
  // Whether the step count crossed a multiple of `every` since `from` (a hook may move it ahead
  // by more than one: DiLoCo's time budget); with steps of one, loop.step % every == 0.
  auto crossed = [&](int64_t every, int64_t from) { return every > 0 && loop.step / every > from / every; };
  int64_t agreed_at = loop.step;  // the step at the last point where every island held the same step
  auto checkpoint = [&](StepRow* row) {
    const SaveReport cost = opts.save();
    saved = true;
    if (!row) return;
    row->ckpt_stall_s = cost.stall_s;
    if (cost.wait_s > 0) row->ckpt_wait_s = cost.wait_s;
    row->ckpt_write_s = cost.write_s;
  };
  while (loop.step < cfg.train.steps) {
    hooks.before_step(loop);
    const int64_t before = loop.step;  // a joiner's admission may have set it
    if (hooks.steps_agreed()) agreed_at = before;
    const double t0 = now_s();
    const int batch = batch_at(cfg.train, loop.tokens, T);
    const LossParts loss = loop.gradients(batch);
    const double t1 = now_s();
    hooks.after_gradients(loop);
    // Up to here the step wrote no saved tensor (the passes read the parameters; the hooks
    // write gradients only), so the last save's copy ran alongside; from here on it writes
    // them (a rollback, the optimizer, outer steps): the copy must be done.
    if (opts.fence)
      if (const std::optional<double> w = opts.fence()) fenced = *w;
    const double t2 = now_s();
    if (!hooks.keep_batch(loop, loss.total())) continue;  // rolled back: the batch is skipped
    if (!std::isfinite(loss.total())) fail_on_loss(loss, loop.step + 1, opts.who);
    StepRow row{.grad_norm = engine.clip_grads(cfg.optim.grad_clip), .batch_size = batch};
    row.ckpt_fence_s = std::exchange(fenced, std::nullopt);
    row.lr = lr_at(cfg.optim, loop.step, cfg.train.steps);
    engine.optimizer_step(row.lr);
    add_router_loads(row, engine, cfg.model, balanced);
    ++loop.step;
    loop.tokens += int64_t(batch) * T * opts.workers;
    clocks.compute_s += (t1 - t0) + (now_s() - t2);
    clocks.comm_s += t2 - t1;
    row.step = loop.step, row.tokens = loop.tokens;
    row.loss = loss.ce, row.aux_loss = loss.aux, row.z_loss = loss.z;
    hooks.after_inner_step(loop, row, clocks);
    const double dt = now_s() - t0;
    row.tokens_per_s = double(batch) * T * opts.workers / dt;
    const bool last = loop.step == cfg.train.steps;
    if (opts.evaluates() && loop.has_val() && cfg.train.eval_every > 0 && (crossed(cfg.train.eval_every, before) || last)) {
      row.val_loss = result.final_val_loss = loop.validate();
      for (size_t i = 0; loop.train_data.mixes() && i < loop.val_losses.size(); ++i)
        if (!std::isnan(loop.val_losses[i])) row.val_losses[loop.train_data.dirs()[i]] = loop.val_losses[i];
      if (opts.progress) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "step %ld: val_loss %.4f", long(loop.step), *row.val_loss);
        opts.progress->note(buf);
      }
    }
    hooks.finish_row(row, clocks);
    row.time_s = now_s() - t_start;
    if (loop.step == 1 || result.first_loss == 0) result.first_loss = loss.ce;
    result.final_loss = loss.ce;
    const bool stopping = !last && opts.stop_requested && opts.stop_requested();
    if (hooks.steps_agreed()) {
      checkpoint_due = checkpoint_due || crossed(cfg.checkpoint.every, agreed_at) || last || stopping;
      agreed_at = loop.step;
    }
    if (checkpoint_due && hooks.can_checkpoint()) checkpoint(&row), checkpoint_due = false;
    if (loop.step % cfg.train.log_every == 0 || last || row.val_loss || row.theta_hash || row.ckpt_stall_s ||
        row.ckpt_fence_s)
      opts.write_row(to_json(row));
    if (opts.progress) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "loss %.4f | lr %.2e | %.0f tok/s", loss.ce, row.lr, row.tokens_per_s);
      opts.progress->update(loop.step, buf);
    }
    if (stopping && !checkpoint_due) {  // its checkpoint written: the run may resume from this step
      result.stopped = true;
      break;
    }
    if (opts.stop_after > 0 && loop.step >= opts.stop_after && !last) break;
  }
  if (opts.progress) opts.progress->finish();
  if (!saved) checkpoint(nullptr);
  result.checkpoint = opts.finish_saves();  // the final save is waited for
  return result;
}

}  // namespace atl
