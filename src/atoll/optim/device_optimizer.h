// The inner optimizer on the device: optim/optimizer.h's grouping (Muon for hidden matrices
// with optim.name = muon, AdamW for the rest, or AdamW everywhere) and semantics, stepping the
// flat device buffers of DeviceModel with the adamw and muon kernels, plus global-norm gradient
// clipping (optim/clip.h). Moments are flat device buffers of the same layout, zero at the
// start. Muon's Newton-Schulz runs in fp32 (the CPU's bf16 option is not taken here).
//
// Plain C++ (pimpl), like device_model.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "atoll/config/config.h"
#include "atoll/model/layout.h"

namespace atl::gpu {

class DeviceOptimizer {
 public:
  // ConfigError for optim.name = sgd (no device kernel yet).
  DeviceOptimizer(const OptimConfig& cfg, const ParamLayout& layout);
  ~DeviceOptimizer();
  DeviceOptimizer(const DeviceOptimizer&) = delete;
  DeviceOptimizer& operator=(const DeviceOptimizer&) = delete;

  // One step at learning rate lr on params [layout.total()] (device), reading grads (device).
  // Advances the step count first, so the first step has t = 1. Then, as Optimizer::step, bias
  // balancing on the balanced rows (optim/bias_balance.h; on the host: a few floats per layer,
  // which makes a model with such rows wait for the device here). Otherwise asynchronous.
  void step(float* params, const float* grads, double lr);

  // clip_grad_norm of optim/clip.h on grads [layout.total()] (device), the balanced rows' slots
  // left out of the norm (they hold router loads); returns the norm before clipping (reading it
  // back waits for the device).
  double clip_grad_norm(float* grads, double max_norm);

  int64_t step_count() const;
  void set_step_count(int64_t t);

  // Host <-> device copies of the moments [layout.total()] each (Optimizer::m() and v()).
  void upload_state(const float* m, const float* v);
  void download_state(float* m, float* v) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace atl::gpu
