// The device side of model/norm_residual.h: RMSNorm with a gain [C] over backend/cuda/rmsnorm.h.
// The residual adds are backend/cuda/elementwise.h's add(), called by model/device_block.cu.
#include "atoll/backend/cuda/rmsnorm.h"
#include "atoll/model/device_part.cuh"

namespace atl::gpu {

DeviceRmsNorm::DeviceRmsNorm(const ModelConfig& m, const ParamLayout& layout, const std::string& name,
                             const DevicePartSizes& s, Carver& carve)
    : gain_(layout.at(name).offset), eps_(m.norm_eps), rstd_(carve.take<float>(size_t(s.max_tokens))) {}

void DeviceRmsNorm::forward(float* out, const float* x, const DeviceContext& c) {
  rmsnorm_forward(out, rstd_, x, c.mm.param(gain_), c.d.N, c.d.C, eps_);
}

void DeviceRmsNorm::backward(float* dx, const float* dout, const float* x, const DeviceContext& c) {
  rmsnorm_backward(dx, c.grads + gain_, dout, x, rstd_, c.mm.param(gain_), c.d.N, c.d.C);
}

}  // namespace atl::gpu
