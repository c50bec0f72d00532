#include "atoll/train/step.h"

#include <cmath>
#include <string>
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

std::optional<StepRow> train_step(Loop& loop, StepHooks& hooks, const DriverOptions& opts, StepState& state) {
  loop.enter_phase();  // a data phase's settings (context extension) hold from this step's batch on
  const Config& cfg = loop.cfg;
  const int T = cfg.model.seq_len;
  Engine& engine = *loop.engine;
  const double t0 = now_s();
  const int batch = batch_at(cfg.train, loop.tokens, T);
  const LossParts loss = loop.gradients(batch);  // zero grads, forward, backward
  const double t1 = now_s();
  hooks.after_gradients(loop);
  if (opts.fence)  // from here on the step writes saved tensors: the save's copy must be done
    if (const std::optional<double> w = opts.fence()) state.fenced = *w;
  const double t2 = now_s();
  if (!hooks.keep_batch(loop, loss.total())) return std::nullopt;  // rolled back: the batch is skipped
  if (!std::isfinite(loss.total())) fail_on_loss(loss, loop.step + 1, opts.who);
  StepRow row{.grad_norm = engine.clip_grads(cfg.optim.grad_clip), .batch_size = batch, .seq_len = T};
  row.ckpt_fence_s = std::exchange(state.fenced, std::nullopt);
  row.lr = lr_at(cfg.optim, loop.step, cfg.train.steps);
  engine.optimizer_step(row.lr);  // update
  add_router_loads(row, engine, cfg.model, state.balanced);
  ++loop.step;
  loop.tokens += int64_t(batch) * T * opts.workers;
  state.clocks.compute_s += (t1 - t0) + (now_s() - t2);
  state.clocks.comm_s += t2 - t1;
  row.step = loop.step, row.tokens = loop.tokens;
  row.loss = loss.ce, row.aux_loss = loss.aux, row.z_loss = loss.z;
  return row;
}

}  // namespace atl
