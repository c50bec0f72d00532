// The inner optimizer: walks the layout table and steps every tensor of the flat parameter
// buffer with AdamW or Muon (DESIGN.md: Muon for hidden 2-D matrices, AdamW for embeddings,
// head, norms and router), or plain SGD everywhere (sgd.h), owning the optimizer state as
// flat buffers of the same layout.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/model/layout.h"
#include "atoll/optim/adamw.h"
#include "atoll/optim/muon.h"
#include "atoll/optim/sgd.h"
#include "atoll/optim/zero_shard.h"

namespace atl {

// Seconds spent in step() since construction, by method.
struct OptimizerTimes {
  double adamw_s = 0.0;
  double muon_s = 0.0;
  double total_s() const { return adamw_s + muon_s; }
};

// Which method steps which tensor, decided once from the layout table: with optim.name = muon,
// Muon takes each 2-D matrix of a hidden tensor (an expert tensor [E, rows, cols] is E
// independent matrices) and AdamW the rest; otherwise every tensor is in `adamw` (stepped by
// AdamW, or SGD for optim.name = sgd). Optimizer and the device optimizer
// (device_optimizer.h) share it, so the CPU and the GPU group alike.
struct OptimizerGroups {
  std::vector<ParamEntry> adamw;  // tensors stepped by AdamW (or SGD)
  std::vector<MuonMatrix> muon;   // matrices stepped by Muon, one per expert
};
OptimizerGroups group_tensors(const OptimConfig& cfg, const ParamLayout& layout);

// AdamW's hyperparameters for tensor e at learning rate lr (decay where the table says).
AdamWOptions adamw_options(const OptimConfig& cfg, const ParamEntry& e, double lr);

class Optimizer {
 public:
  // cfg.name: "adamw" (every tensor AdamW), "muon" (hidden matrices Muon, the rest AdamW) or
  // "sgd" (every tensor plain SGD, sgd.h; its time counts as adamw_s).
  // The state buffers start at zero and the step count at 0. `shard`: a ZeRO-1 rank's shard
  // (zero_shard.h), whose state alone it holds and whose tensors alone it steps; by default
  // every element.
  Optimizer(const OptimConfig& cfg, const ParamLayout& layout, std::optional<ZeroShard> shard = std::nullopt);

  // One step at learning rate lr on params [layout.total()], reading grads [layout.total()]
  // (only the shard's elements of either are touched). Advances the step count first, so the
  // first step has t = 1. Then, where the shard has balanced rows (a zaya router's balancing
  // biases), the bias balancing step (bias_balance.h).
  void step(float* params, const float* grads, double lr);

  // Muon's Newton-Schulz in batched bf16 products (muon.h newton_schulz_bf16); set for
  // train.precision = bf16.
  void set_muon_bf16(bool on) { muon_bf16_ = on; }

  int64_t step_count() const { return t_; }
  void set_step_count(int64_t t);  // for resuming from a checkpoint

  // The elements whose state this optimizer holds: [0, layout.total()) unless sharded.
  const ZeroShard& shard() const { return shard_; }
  bool sharded() const { return sharded_; }
  // [shard().size()], element i for element shard().lo + i of the flat buffers: AdamW's first
  // moment, and Muon's momentum buffer for hidden matrices.
  std::vector<float>& m() { return m_; }
  // [shard().size()]: AdamW's second moment (zero, unused, where Muon applies).
  std::vector<float>& v() { return v_; }
  // The state for checkpoints, by the names checkpoints use.
  std::vector<std::pair<std::string, std::vector<float>*>> state_buffers() {
    return {{"adam_m", &m_}, {"adam_v", &v_}};
  }

  const OptimizerTimes& times() const { return times_; }

 private:
  void step_tensors(float* params, const float* grads, double lr);  // the optimizer's own step

  OptimConfig cfg_;
  ParamLayout layout_;
  ZeroShard shard_;
  bool sharded_ = false;
  OptimizerGroups groups_;                 // the shard's, offsets from shard_.lo
  std::vector<ParamEntry> balanced_;       // the shard's balanced rows, offsets from shard_.lo
  std::vector<float> m_, v_;               // [shard_.size()] each
  std::vector<MuonWorkspace> workspaces_;  // one per thread
  int64_t t_ = 0;
  bool muon_bf16_ = false;
  OptimizerTimes times_;
};

}  // namespace atl
