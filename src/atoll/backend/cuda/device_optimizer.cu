#include "atoll/backend/cuda/device_optimizer.h"

#include <algorithm>
#include <vector>

#include "atoll/backend/cuda/adamw.h"
#include "atoll/backend/cuda/arena.h"
#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/clip.h"
#include "atoll/backend/cuda/muon.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"

namespace atl::gpu {
namespace {

// The grouping of Optimizer's constructor (optim/optimizer.cc), decided once from the table.
struct Groups {
  std::vector<ParamEntry> adamw;  // tensors stepped by AdamW
  std::vector<MuonMatrix> muon;   // matrices stepped by Muon, one per expert
  int64_t muon_scratch = 0;       // floats for the largest Muon matrix
};

Groups group_tensors(const OptimConfig& cfg, const ParamLayout& layout) {
  Groups g;
  const bool muon = cfg.name == "muon";
  for (const ParamEntry& e : layout.entries()) {
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
    g.muon_scratch = std::max(g.muon_scratch, muon_scratch_floats(int(e.rows()), int(e.cols())));
  }
  return g;
}

}  // namespace

struct DeviceOptimizer::Impl {
  Impl(const OptimConfig& c, const ParamLayout& layout)
      : cfg(c),
        total(layout.total()),
        groups(group_tensors(c, layout)),
        arena(3 * DeviceArena::kAlign + sizeof(float) * (2 * total + size_t(groups.muon_scratch)) +
              sizeof(double) * size_t(grad_norm_scratch_doubles())) {
    m = arena.alloc<float>(total);
    v = arena.alloc<float>(total);
    muon_scratch = arena.alloc<float>(size_t(groups.muon_scratch));
    norm_scratch = arena.alloc<double>(size_t(grad_norm_scratch_doubles()));
    ATOLL_CUDA_CHECK(cudaMemset(m, 0, sizeof(float) * total));
    ATOLL_CUDA_CHECK(cudaMemset(v, 0, sizeof(float) * total));
  }

  OptimConfig cfg;
  size_t total;
  Groups groups;
  DeviceArena arena;
  float *m = nullptr, *v = nullptr, *muon_scratch = nullptr;
  double* norm_scratch = nullptr;
  Blas blas;  // Muon's products, on the default stream
  int64_t t = 0;
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
    const AdamWOptions opt{.lr = lr,
                           .beta1 = s.cfg.beta1,
                           .beta2 = s.cfg.beta2,
                           .eps = s.cfg.eps,
                           .weight_decay = e.takes_weight_decay() ? s.cfg.weight_decay : 0.0};
    gpu::adamw_update(params + e.offset, s.m + e.offset, s.v + e.offset, grads + e.offset, e.numel, s.t, opt);
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
}

double DeviceOptimizer::clip_grad_norm(float* grads, double max_norm) {
  return gpu::clip_grad_norm(grads, impl_->total, max_norm, impl_->norm_scratch);
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
