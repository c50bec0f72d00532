#include "atoll/train/island_hooks.h"

#include <algorithm>

#include "atoll/core/check.h"
#include "atoll/core/worker_phase.h"
#include "atoll/core/errors.h"
#include "atoll/model/ring_attention.h"
#include "atoll/optim/bias_balance.h"
#include "atoll/train/metrics.h"
#include "atoll/train/state_transfer.h"

namespace atl {
namespace {

void scale(float* x, size_t n, double s) {
  const float f = float(s);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) x[i] *= f;
}

// The end of the data-parallel warm start: θ ← the warm parameters, which every island must hold
// bit for bit (compared by hash across islands, so a broken warm start stops the run here rather
// than drifting silently). The outer momentum is still zero. Returns θ's hash.
std::string start_diloco(DilocoSync& diloco, ProcessGroup& outer, const std::string& who, const float* params) {
  std::vector<float>& theta = diloco.theta();
  std::copy(params, params + theta.size(), theta.begin());
  const std::string hash = diloco.theta_hash();
  try {
    outer.expect_same("parameters after the data-parallel warm start (xxh3)", hash);
  } catch (const ConfigError& e) {
    throw Error(who + ": " + e.what() + "; the islands took different steps while they should have shared every "
                "gradient (a bug: please report it with the run's config)");
  }
  return hash;
}

}  // namespace

int64_t dp_warmup_steps(const Config& cfg) { return std::min(cfg.diloco.dp_warmup_steps, cfg.train.steps); }

void IslandMeanHook::after_gradients(Loop& loop) {
  Engine& engine = *loop.engine;
  const int M = place_.workers_per_island;
  const size_t n = engine.layout().total();
  float* grads = engine.host().grads;
  if (M > 1 && engine.has_island_mean()) {  // on the GPU: NCCL's mean, in device memory
    engine.island_grad_mean();
  } else if (M > 1 && engine.zero1()) {  // ZeRO-1: each rank receives the island's mean of its shard only
    // The routers' loads (a few floats per router) are summed whole on every rank besides: the
    // shard that holds a row balances on the island's loads, and every rank logs them.
    const std::vector<std::pair<size_t, size_t>> spans = balanced_spans(engine.layout());
    std::vector<float> loads;
    for (const auto& [offset, count] : spans) loads.insert(loads.end(), grads + offset, grads + offset + count);
    if (!loads.empty()) inner_.allreduce_sum(loads.data(), loads.size());
    inner_.reduce_scatter_sum(grads, engine.zero_shard_sizes());
    const ZeroShard shard = engine.moments().shard;
    scale(grads + shard.lo, shard.size(), 1.0 / M);
    scale(loads.data(), loads.size(), 1.0 / M);
    size_t at = 0;
    for (const auto& [offset, count] : spans) std::copy_n(loads.data() + (at += count) - count, count, grads + offset);
  } else if (M > 1) {  // synchronous data parallel inside the island: the mean gradient
    inner_.allreduce_sum(grads, n);
    scale(grads, n, 1.0 / M);
  }
}

void IslandMeanHook::finish_row(StepRow& row, const StepClocks& clocks) {
  row.island = place_.island;
  row.rank = place_.rank;
  // Every epoch's outer group; not what checkpoint saves sent.
  row.comm_bytes = inner_.stats().bytes_sent + outer_.stats().bytes_sent -
                   (place_.checkpoint_bytes ? *place_.checkpoint_bytes : 0);
  row.comm_s = clocks.comm_s;
  row.compute_s = clocks.compute_s;
  row.idle_s = clocks.idle_s;
  if (cfg_.diloco.overlap_steps > 0) row.overlap_comm_s = clocks.overlap_s;
  if (cfg_.train.context_parallel > 1) {
    const RingClock ring = ring_clock();
    row.ring_compute_s = ring.compute_s, row.ring_wait_s = ring.wait_s;
    if (ring.sync_s > 0) row.ring_sync_s = ring.sync_s;
  }
}

// The islands' means averaged across islands, so every worker takes the same step. Gloo's ring
// hands every rank the same sum, so the islands stay bit-identical. Rank r averages the r-th
// M-th over its outer group, then the island shares the shards, so the slow links carry each
// gradient element once per island.
void WarmStartHook::after_gradients(Loop& loop) {
  const int N = place_.islands, M = place_.workers_per_island;
  if (N <= 1 || loop.step >= dp_warmup_) return;
  Engine& engine = *loop.engine;
  const size_t n = engine.layout().total();
  float* grads = engine.host().grads;
  if (engine.zero1()) {  // ZeRO-1: a rank needs the mean of its shard only, which rank r of every island shares
    const ZeroShard shard = engine.moments().shard;
    outer_.group().allreduce_sum(grads + shard.lo, shard.size());
    scale(grads + shard.lo, shard.size(), 1.0 / N);
    return;
  }
  if (shards_.empty()) shards_ = even_part_sizes(n, M);
  const auto [lo, hi] = even_part(n, place_.rank, M);
  engine.to_host(kGrads);
  outer_.group().allreduce_sum(grads + lo, hi - lo);  // the warm start is not elastic: a loss ends the run
  scale(grads + lo, hi - lo, 1.0 / N);
  if (M > 1) inner_.allgatherv(grads, shards_);
  engine.to_device(kGrads);
}

void WarmStartHook::after_inner_step(Loop& loop, StepRow& row, StepClocks& clocks) {
  (void)clocks;
  if (dp_warmup_ == 0 || loop.step != dp_warmup_) return;
  Engine& engine = *loop.engine;
  engine.to_host(kParams);
  row.theta_hash = theta_hash_ = start_diloco(diloco_, outer_.group(), place_.who, engine.host().params);
  row.outer_step = 0;
  engine.to_device(kParams);
  if (events_) events_->write(event_row("diloco_start", {{"step", loop.step}, {"theta_hash", theta_hash_}}));
}

void DilocoHook::after_inner_step(Loop& loop, StepRow& row, StepClocks& clocks) {
  Engine& engine = *loop.engine;
  // The outer steps due after this step (dist/streaming.h): blocking, started, or finished.
  // The outer step works on the host copy: down before any step that may read or write θ (a
  // fragment due, the last step, or an exchange in flight, which may finish here), up after
  // (no-ops on the CPU). after_step() touches θ at no other step.
  const int64_t inner_step = loop.step - dp_warmup_;  // DiLoCo's step count, 0 at its start
  agreed_ = true;
  if (inner_step <= 0) {  // the warm start: every island takes every step; the first round begins after it
    if (budget_) streaming_.begin_round();
    return;
  }
  if (budget_) {
    const int64_t tokens = int64_t(row.batch_size) * row.seq_len;  // the step's: a data phase may change it
    streaming_.count_step(tokens * place_.workers_per_island);
    round_counted_ += tokens * place_.workers_per_island * place_.islands;  // what the driver added to loop.tokens
  }
  if (diloco_.merges_experts()) {  // this worker's slots per expert in the step (the island's are summed at the sync)
    const std::vector<double> counts = engine.topk_choice_counts();
    ATOLL_CHECK(!counts.empty()) << place_.who << ": diloco.expert_merge = \"tokens\" needs the engine's expert counts";
    diloco_.add_expert_counts(counts.data());
  }
  const bool theta_on_host = inner_step >= diloco_steps_ || (streaming_.in_flight() && !delayed_) ||
                             streaming_.due(inner_step, diloco_steps_) >= 0;
  if (theta_on_host) enter_phase(WorkerPhase::kExchanging), engine.to_host(kParams);
  const StreamStep st = streaming_.after_step(inner_step, diloco_steps_, engine.host().params);
  if (theta_on_host) engine.to_device(kParams);
  clocks.comm_s += st.comm_s;
  clocks.idle_s += st.idle_s;
  clocks.overlap_s += st.overlap_s;
  if (st.synced) {
    row.outer_step = st.synced->outer_step;
    row.fragment = st.synced->fragment;
    row.theta_hash = theta_hash_ = st.synced->theta_hash;
    row.momentum_hash = st.synced->momentum_hash;
    if (budget_) adopt_round(loop, row, st);
  }
  agreed_ = !budget_ || st.synced.has_value();
  log_incidents(st, loop);
}

// Every island of the round adopts the same figures from the guard's all-gather: the step of the
// island that went furthest (a slow island jumps ahead; the optimizer's count moves with it, so
// run-wide state stays run-wide), and the run's tokens corrected from the driver's count (every
// worker's batch taken as this one's, every step) to what the round's islands trained.
void DilocoHook::adopt_round(Loop& loop, StepRow& row, const StreamStep& st) {
  const SyncResult& r = *st.synced;
  const int64_t jump = dp_warmup_ + r.furthest_step - loop.step;
  ATOLL_CHECK(jump >= 0) << place_.who << ": the round's furthest step " << r.furthest_step << " is behind this island's "
                         << loop.step - dp_warmup_;
  loop.step += jump;
  loop.engine->set_optimizer_steps(loop.engine->optimizer_steps() + jump);
  loop.tokens += r.round_tokens - round_counted_;
  round_counted_ = 0;
  row.step = loop.step, row.tokens = loop.tokens;
  row.round_steps = st.round_steps, row.round_tokens = st.round_tokens, row.round_weight = r.weight;
}

void DilocoHook::log_incidents(const StreamStep& st, const Loop& loop) {
  if (!incidents_ || st.incidents.empty() || outer_.view().islands.front() != place_.island) return;
  for (const UpdateIncident& i : st.incidents) {
    nlohmann::json e = {{"island", i.island}, {"rank", place_.rank}, {"step", loop.step}, {"norm", i.norm},
                        {"reported_by", place_.island}};
    if (st.synced) e["outer_step"] = st.synced->outer_step;
    if (i.kind == "dropped_update") e["why"] = i.why;
    else e["median"] = i.median, e["scale"] = i.scale;
    incidents_->write(event_row(i.kind, e));
  }
}

void ElasticHook::before_step(Loop& loop) {
  const std::optional<View> next = streaming_.take_admission();
  if (!next) return;
  state_.fence();  // before the host copy is refreshed and the admission writes state
  loop.engine->to_host(kAllState);  // the source sends what the step left (a no-op on the CPU)
  outer_.enter(*next);
  admit(outer_, cfg_, state_);
}

void ElasticHook::after_inner_step(Loop& loop, StepRow& row, StepClocks& clocks) {
  (void)loop, (void)clocks;
  if (row.theta_hash) outer_.membership().put_record(worker_record(cfg_, state_));
}

}  // namespace atl
