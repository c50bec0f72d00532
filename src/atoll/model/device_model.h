// The whole model on one GPU: Model<float>'s forward and backward (model/model.h) with the
// parameters, gradients and activations in device memory, run by the kernels of backend/cuda/
// and products through the BLAS wrapper in fp32. Parameters and gradients are flat device
// buffers laid out by ParamLayout (the same offsets as the host buffers, so one copy moves
// them); activations come from one device arena sized at construction for `max_batch`
// sequences, so a step allocates nothing.
//
// Where things live, as on the CPU: device_model.cu is the model (embedding, the blocks, final
// norm, head and loss, the arena; device_model_buffers.h its buffers); device_block.cu composes
// one block from the device parts of device_part.cuh in model/block.cc's order; each part's
// device side sits beside its CPU file pair: attention_gqa.cu, attention_cca.cu, router_topk.cu,
// router_zaya.cu, experts_swiglu.cu, norm_residual.cu (norms and residual merges).
//
// Precision::kBf16 (train.precision = bf16), as Model<float>'s bf16 mode: parameters,
// gradients and every non-product operation stay fp32; each forward rounds the parameters to
// a bf16 copy, and the matrix products (q/k/v/o, the experts, the LM head; the router stays
// fp32, as on the CPU) take bf16 inputs, the activations rounded just before each product,
// with fp32 accumulation. Unlike the CPU, attention itself runs in fp32 on fp32 q, k, v.
//
// Plain C++ (pimpl): the trainer and the CLI include it without the GPU headers. Every call
// may throw GpuError (no device, out of memory, a failed launch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "atoll/core/collective.h"
#include "atoll/model/layout.h"
#include "atoll/model/model.h"
#include "atoll/model/model_config.h"

namespace atl::gpu {

struct DeviceModelOptions {
  // Rows of logits alive at once in the LM head and loss (0: as many as fit in 128 MiB).
  int head_rows = 0;
  Precision precision = Precision::kFp32;  // of the matrix products (see above)
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
  Precision precision() const;
  size_t device_bytes() const;  // the arena: parameters, gradients and activations

  // Device pointers to the flat buffers [layout().total()] (for the device optimizer).
  float* params();
  float* grads();

  // Host <-> device copies of whole flat buffers [layout().total()] (synchronous).
  void upload_params(const float* host);
  void download_params(float* host) const;
  void download_grads(float* host) const;
  void upload_grads(const float* host);
  // Zeroes the gradients and the choice counts.
  void zero_grads();

  // As Model::topk_choice_counts: slots each expert took in the training passes since
  // zero_grads(), [L*E], every layer's; counted on the device, read back here.
  std::vector<double> topk_choice_counts() const;

  // As Model<float>::forward_backward: inputs, targets [B,T] in host memory (ids checked on the
  // host), B <= max_batch; gradients of loss_scale * (ce + aux + z) accumulated (+=).
  LossParts forward_backward(const int32_t* inputs, const int32_t* targets, int B, double loss_scale = 1.0);

  // Loss only; with position_losses ([B*T] host memory, =), each position's cross-entropy as
  // Model::forward gives it.
  LossParts forward(const int32_t* inputs, const int32_t* targets, int B, float* position_losses = nullptr);

  // Context extension (data.phases), as Model::set_sequence: from now on sequences of `seq_len`
  // tokens with RoPE base `rope_theta`, at most `max_batch` of them. The parameters, gradients
  // and choice counts are kept (no row depends on the length); the arena (activations,
  // workspaces, RoPE tables) is made again for the new length. The kept buffers wait in host
  // memory meanwhile, so the old arena is freed before the new one is taken: the device's peak
  // is the larger of the two, not both. If the new arena does not fit (GpuError), the model is
  // rebuilt as it was, with its state, and the error is rethrown.
  void set_sequence(int seq_len, double rope_theta, int max_batch);

  // Context parallelism, as Model::set_context_parallel (docs/long_context.md): from now on the
  // model holds rank group.rank()'s zigzag rows of each sequence (inputs and targets [B, T_r]),
  // attention (GQA and CCA) runs round the group's ring (model/device_ring_attention.h), CCA
  // exchanges its chunks' boundary rows with the neighbours (model/cca_boundary.h), the top-k
  // routers add their loss sums over the group, the zaya routers' loads are shares of the whole
  // sequences' tokens, and the cross-entropy is divided by the whole sequences' B·T tokens, so
  // the ranks' losses and gradients add up to one model's over whole sequences. The arena is
  // made again for T_r tokens a sequence (as set_sequence keeps the state); null goes back to
  // whole sequences. fp32 products only. A CCA chunk shorter than its window throws ConfigError
  // and leaves the model as it was. The group must outlive the model's calls.
  void set_context_parallel(Collective* group);
  // Tokens of each sequence the model holds: seq_len, or this rank's share.
  int local_seq_len() const;

 private:
  void rebuild(const ModelConfig& m, int max_batch, Collective* cp);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace atl::gpu
