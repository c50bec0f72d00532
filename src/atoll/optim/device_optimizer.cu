#include "atoll/optim/device_optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "atoll/backend/cuda/arena.h"
#include "atoll/backend/cuda/check.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/optim/adamw.cuh"
#include "atoll/optim/bias_balance.h"
#include "atoll/optim/clip.cuh"
#include "atoll/optim/muon.cuh"
#include "atoll/optim/optimizer.h"

namespace atl::gpu {
namespace {

// Floats of Muon scratch for the largest matrix Muon steps.
int64_t muon_scratch_for(const OptimizerGroups& g) {
  int64_t most = 0;
  for (const MuonMatrix& mm : g.muon) most = std::max(most, muon_scratch_floats(mm.rows, mm.cols));
  return most;
}

}  // namespace

struct DeviceOptimizer::Impl {
  Impl(const OptimConfig& c, const ParamLayout& layout)
      : cfg(c),
        total(layout.total()),
        groups(group_tensors(c, layout)),
        muon_scratch_size(muon_scratch_for(groups)),
        arena(3 * DeviceArena::kAlign + sizeof(float) * (2 * total + size_t(muon_scratch_size)) +
              sizeof(double) * size_t(grad_norm_scratch_doubles())),
        balance{.lr = c.bias_balance_lr, .beta1 = c.beta1, .beta2 = c.beta2, .eps = c.eps} {
    for (const ParamEntry* row : balanced_rows(layout)) {
      balanced.push_back(*row);
      packed.push_back(*row), packed.back().offset = packed_size, packed_size += row->numel;
    }
    hp.resize(packed_size), hm.resize(packed_size), hv.resize(packed_size), hg.resize(packed_size);
    m = arena.alloc<float>(total);
    v = arena.alloc<float>(total);
    muon_scratch = arena.alloc<float>(size_t(muon_scratch_size));
    norm_scratch = arena.alloc<double>(size_t(grad_norm_scratch_doubles()));
    ATOLL_CUDA_CHECK(cudaMemset(m, 0, sizeof(float) * total));
    ATOLL_CUDA_CHECK(cudaMemset(v, 0, sizeof(float) * total));
  }

  OptimConfig cfg;
  size_t total;
  OptimizerGroups groups;
  int64_t muon_scratch_size;  // floats, for the largest Muon matrix
  DeviceArena arena;
  float *m = nullptr, *v = nullptr, *muon_scratch = nullptr;
  double* norm_scratch = nullptr;
  Blas blas;  // Muon's products, on the default stream
  int64_t t = 0;
  // Bias balancing (optim/bias_balance.h) on the host, as Optimizer::step does it: the balanced
  // rows are a few dozen floats per layer, so they travel to the host and back each step.
  AdamWOptions balance;
  std::vector<ParamEntry> balanced, packed;  // the rows at their offsets, and packed one after another
  size_t packed_size = 0;
  std::vector<float> hp, hm, hv, hg;  // [packed_size] the rows' params, moments and loads on the host

  // Each balanced row of a flat device buffer to its packed place in a host buffer, and back.
  void rows_down(float* host, const float* dev) const {
    for (size_t i = 0; i < balanced.size(); ++i)
      copy_to_host(host + packed[i].offset, dev + balanced[i].offset, sizeof(float) * balanced[i].numel);
  }
  void rows_up(float* dev, const float* host) const {
    for (size_t i = 0; i < balanced.size(); ++i)
      copy_to_device(dev + balanced[i].offset, host + packed[i].offset, sizeof(float) * balanced[i].numel);
  }
};

DeviceOptimizer::DeviceOptimizer(const OptimConfig& cfg, const ParamLayout& layout) {
  if (cfg.name != "adamw" && cfg.name != "muon")
    throw ConfigError("optim.name = \"" + cfg.name +
                      "\" has no GPU implementation; fix: set optim.name = \"adamw\" or \"muon\", or train.device = "
                      "\"cpu\"");
  impl_ = std::make_unique<Impl>(cfg, layout);
}

DeviceOptimizer::~DeviceOptimizer() = default;

void DeviceOptimizer::step(float* params, const float* grads, double lr) {
  Impl& s = *impl_;
  ++s.t;
  for (const ParamEntry& e : s.groups.adamw) {
    gpu::adamw_update(params + e.offset, s.m + e.offset, s.v + e.offset, grads + e.offset, e.numel, s.t,
                      adamw_options(s.cfg, e, lr));
  }
  for (const MuonMatrix& mm : s.groups.muon) {
    const MuonOptions opt{.lr = lr,
                          .momentum = s.cfg.muon_momentum,
                          .weight_decay = mm.decay ? s.cfg.weight_decay : 0.0,
                          .ns_steps = s.cfg.ns_steps,
                          .bf16 = false};
    gpu::muon_update(params + mm.offset, s.m + mm.offset, grads + mm.offset, mm.rows, mm.cols, opt, s.blas,
                     s.muon_scratch);
  }
  // Bias balancing follows the step, as on the CPU; nothing where no row is balanced.
  if (s.balanced.empty()) return;
  s.rows_down(s.hp.data(), params), s.rows_down(s.hm.data(), s.m), s.rows_down(s.hv.data(), s.v);
  s.rows_down(s.hg.data(), grads);
  balance_biases(s.hp.data(), s.hm.data(), s.hv.data(), s.hg.data(), s.packed, s.t, s.balance);
  s.rows_up(params, s.hp.data()), s.rows_up(s.m, s.hm.data()), s.rows_up(s.v, s.hv.data());
}

// The slots of balanced rows hold router loads, not gradients (optim/bias_balance.h): the norm
// leaves them out, as optim/clip.h's left_out spans. They wait on the host while the norm runs
// over the rest with them zeroed, then go back scaled as clip_to_norm scales the rest.
double DeviceOptimizer::clip_grad_norm(float* grads, double max_norm) {
  Impl& s = *impl_;
  if (s.balanced.empty()) return gpu::clip_grad_norm(grads, s.total, max_norm, s.norm_scratch);
  s.rows_down(s.hg.data(), grads);
  for (const ParamEntry& row : s.balanced)
    ATOLL_CUDA_CHECK(cudaMemset(grads + row.offset, 0, sizeof(float) * row.numel));
  const double norm = gpu::clip_grad_norm(grads, s.total, max_norm, s.norm_scratch);
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm)
    for (float& g : s.hg) g *= float(max_norm / norm);
  s.rows_up(grads, s.hg.data());
  return norm;
}

int64_t DeviceOptimizer::step_count() const { return impl_->t; }

void DeviceOptimizer::set_step_count(int64_t t) {
  ATOLL_CHECK_GE(t, 0);
  impl_->t = t;
}

void DeviceOptimizer::upload_state(const float* m, const float* v) {
  copy_to_device(impl_->m, m, sizeof(float) * impl_->total);
  copy_to_device(impl_->v, v, sizeof(float) * impl_->total);
}

void DeviceOptimizer::download_state(float* m, float* v) const {
  copy_to_host(m, impl_->m, sizeof(float) * impl_->total);
  copy_to_host(v, impl_->v, sizeof(float) * impl_->total);
}

}  // namespace atl::gpu
