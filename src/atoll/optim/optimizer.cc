#include "atoll/optim/optimizer.h"

#include "atoll/core/check.h"
#include "atoll/core/timer.h"
#include "atoll/optim/bias_balance.h"

namespace atl {

OptimizerGroups group_tensors(const OptimConfig& cfg, const ParamLayout& layout) {
  OptimizerGroups g;
  const bool muon = cfg.name == "muon";
  // The grouping is decided once, from the table: Muon takes each 2-D matrix of a hidden
  // tensor as its row describes them (an expert tensor [E, rows, cols] is E independent
  // matrices); buffers (not trainable) are never stepped.
  for (const ParamEntry& e : layout.entries()) {
    if (!e.trainable) continue;
    if (!muon || !e.is_hidden_matrix()) {
      g.adamw.push_back(e);
      continue;
    }
    const size_t per = size_t(e.rows()) * size_t(e.cols());
    ATOLL_CHECK_EQ(per * size_t(e.n_matrices()), e.numel) << e.name;
    for (int64_t k = 0; k < e.n_matrices(); ++k)
      g.muon.push_back({.offset = e.offset + size_t(k) * per,
                        .rows = int(e.rows()),
                        .cols = int(e.cols()),
                        .decay = e.takes_weight_decay()});
  }
  return g;
}

AdamWOptions adamw_options(const OptimConfig& cfg, const ParamEntry& e, double lr) {
  return {.lr = lr,
          .beta1 = cfg.beta1,
          .beta2 = cfg.beta2,
          .eps = cfg.eps,
          .weight_decay = e.takes_weight_decay() ? cfg.weight_decay : 0.0};
}

Optimizer::Optimizer(const OptimConfig& cfg, const ParamLayout& layout, std::optional<ZeroShard> shard)
    : cfg_(cfg), layout_(layout), shard_(shard.value_or(ZeroShard{0, layout.total()})), sharded_(shard.has_value()),
      m_(shard_.size(), 0.0f), v_(shard_.size(), 0.0f) {
  ATOLL_CHECK(cfg.name == "adamw" || cfg.name == "muon" || cfg.name == "sgd")
      << "unknown optim.name '" << cfg.name << "' (adamw | muon | sgd)";
  ATOLL_CHECK_LE(shard_.hi, layout.total());
  // The shard's tensors, with offsets from its start: the step then runs on the shard's spans
  // of the buffers as the unsharded step runs on the whole (a shard holds whole tensors).
  const OptimizerGroups all = group_tensors(cfg, layout);
  for (ParamEntry e : all.adamw)
    if (shard_.contains(e.offset)) e.offset -= shard_.lo, groups_.adamw.push_back(e);
  for (MuonMatrix mm : all.muon)
    if (shard_.contains(mm.offset)) mm.offset -= shard_.lo, groups_.muon.push_back(mm);
  for (const ParamEntry* row : balanced_rows(layout))
    if (shard_.contains(row->offset)) balanced_.push_back(*row), balanced_.back().offset -= shard_.lo;
}

void Optimizer::set_step_count(int64_t t) {
  ATOLL_CHECK_GE(t, 0);
  t_ = t;
}

void Optimizer::step(float* params, const float* grads, double lr) {
  float* p = params + shard_.lo;  // the shard's spans: offsets below count from here
  const float* g = grads + shard_.lo;
  step_tensors(p, g, lr);
  // Bias balancing follows the step (bias_balance.h); nothing where no row is balanced.
  const AdamWOptions balance{.lr = cfg_.bias_balance_lr, .beta1 = cfg_.beta1, .beta2 = cfg_.beta2, .eps = cfg_.eps};
  balance_biases(p, m_.data(), v_.data(), g, balanced_, t_, balance);
}

void Optimizer::step_tensors(float* params, const float* grads, double lr) {
  ++t_;
  if (cfg_.name == "sgd") {  // every tensor plain SGD (sgd.h); m and v stay zero
    ScopedTimer timer(&times_.adamw_s);
    for (const ParamEntry& e : groups_.adamw) {
      const SgdOptions opt{.lr = lr, .weight_decay = e.takes_weight_decay() ? cfg_.weight_decay : 0.0};
      sgd_update(params + e.offset, grads + e.offset, e.numel, opt);
    }
    return;
  }
  {
    ScopedTimer timer(&times_.adamw_s);
    for (const ParamEntry& e : groups_.adamw) {
      const AdamWOptions opt = adamw_options(cfg_, e, lr);
      adamw_update(params + e.offset, m_.data() + e.offset, v_.data() + e.offset, grads + e.offset, e.numel, t_, opt);
    }
  }
  if (!groups_.muon.empty()) {
    ScopedTimer timer(&times_.muon_s);
    const MuonOptions opt{
        .lr = lr, .momentum = cfg_.muon_momentum, .weight_decay = cfg_.weight_decay, .ns_steps = cfg_.ns_steps,
        .bf16 = muon_bf16_};
    muon_update_many(params, m_.data(), grads, groups_.muon, opt, &workspaces_);
  }
}

}  // namespace atl
