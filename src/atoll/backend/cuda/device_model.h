// The whole model on one GPU: Model<float>'s forward and backward (model/model.h) with the
// parameters, gradients and activations in device memory, run by the kernels of this folder
// and products through the BLAS wrapper in fp32. Parameters and gradients are flat device
// buffers laid out by ParamLayout (the same offsets as the host buffers, so one copy moves
// them); activations come from one device arena sized at construction for `max_batch`
// sequences, so a step allocates nothing.
//
// Plain C++ (pimpl): the trainer and the CLI include it without the GPU headers. Every call
// may throw GpuError (no device, out of memory, a failed launch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "atoll/config/config.h"
#include "atoll/model/layout.h"
#include "atoll/model/model.h"

namespace atl::gpu {

struct DeviceModelOptions {
  // Rows of logits alive at once in the LM head and loss (0: as many as fit in 128 MiB).
  int head_rows = 0;
};

class DeviceModel {
 public:
  DeviceModel(const ModelConfig& cfg, int max_batch, const DeviceModelOptions& opts = {});
  ~DeviceModel();
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  const ModelConfig& config() const;
  const ParamLayout& layout() const;
  int max_batch() const;
  size_t device_bytes() const;  // the arena: parameters, gradients and activations

  // Device pointers to the flat buffers [layout().total()] (for the device optimizer).
  float* params();
  float* grads();

  // Host <-> device copies of whole flat buffers [layout().total()] (synchronous).
  void upload_params(const float* host);
  void download_params(float* host) const;
  void download_grads(float* host) const;
  void zero_grads();

  // As Model<float>::forward_backward: inputs, targets [B,T] in host memory (ids checked on the
  // host), B <= max_batch; gradients of loss_scale * (ce + aux + z) accumulated (+=).
  LossParts forward_backward(const int32_t* inputs, const int32_t* targets, int B, double loss_scale = 1.0);

  // Loss only.
  LossParts forward(const int32_t* inputs, const int32_t* targets, int B);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace atl::gpu
