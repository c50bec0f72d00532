// The device side of model/norm_residual.h: RMSNorm with a gain [C] over backend/cuda/rmsnorm.h,
// and where a sub-layer's output joins the stream: the plain add (backend/cuda/elementwise.h)
// or ZAYA1's residual scaling (backend/cuda/residual_affine.h).
#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/elementwise.h"
#include "atoll/backend/cuda/residual_affine.h"
#include "atoll/backend/cuda/rmsnorm.h"
#include "atoll/core/check.h"
#include "atoll/model/device_part.cuh"

namespace atl::gpu {
namespace {

// dst[n] (=) src[n], device to device, queued on the default stream with the kernels.
void copy_floats(float* dst, const float* src, size_t n) {
  if (n) ATOLL_CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(float) * n, cudaMemcpyDeviceToDevice, nullptr));
}

}  // namespace

DeviceRmsNorm::DeviceRmsNorm(const ModelConfig& m, const ParamLayout& layout, const std::string& name,
                             const DevicePartSizes& s, Carver& carve)
    : gain_(layout.at(name).offset), eps_(m.norm_eps), rstd_(carve.take<float>(size_t(s.max_tokens))) {}

void DeviceRmsNorm::forward(float* out, const float* x, const DeviceContext& c) {
  rmsnorm_forward(out, rstd_, x, c.mm.param(gain_), c.d.N, c.d.C, eps_);
}

void DeviceRmsNorm::backward(float* dx, const float* dout, const float* x, const DeviceContext& c) {
  rmsnorm_backward(dx, c.grads + gain_, dout, x, rstd_, c.mm.param(gain_), c.d.N, c.d.C);
}

// The rows' names as model/norm_residual.cc's residual_merge_rows declares them.
DeviceResidualMerge::DeviceResidualMerge(const ModelConfig& m, const ParamLayout& layout, const std::string& name,
                                         bool with_stream, const DevicePartSizes& s, Carver& carve)
    : scaled_(m.residual_scaling), stream_(with_stream) {
  if (!scaled_) return;
  out_scale_ = layout.at(name + (with_stream ? ".out_scale" : "_scale")).offset;
  out_bias_ = layout.at(name + (with_stream ? ".out_bias" : "_bias")).offset;
  if (with_stream) res_scale_ = layout.at(name + ".res_scale").offset, res_bias_ = layout.at(name + ".res_bias").offset;
  a_ = carve.take<float>(size_t(s.max_tokens) * m.dim);
}

void DeviceResidualMerge::forward(float* out, const float* a, const float* r, const DeviceContext& c) {
  const size_t NC = size_t(c.d.N) * c.d.C;
  ATOLL_CHECK_EQ(r != nullptr, stream_) << "a merge with a stream takes one, and only then";
  if (!scaled_) {
    if (r) add(out, a, r, NC);
    else if (out != a) copy_floats(out, a, NC);
    return;
  }
  copy_floats(a_, a, NC);  // before out, which may alias a
  const ResidualAffineRows<const float> w{.out_scale = c.mm.param(out_scale_), .out_bias = c.mm.param(out_bias_),
                                          .res_scale = r ? c.mm.param(res_scale_) : nullptr,
                                          .res_bias = r ? c.mm.param(res_bias_) : nullptr};
  residual_affine_forward(out, a_, r, w, c.d.N, c.d.C);
}

const float* DeviceResidualMerge::backward(float* da, float* dstream, const float* r, const DeviceContext& c) {
  if (!scaled_) return dstream;
  const ResidualAffineRows<const float> w{.out_scale = c.mm.param(out_scale_), .out_bias = c.mm.param(out_bias_),
                                          .res_scale = stream_ ? c.mm.param(res_scale_) : nullptr,
                                          .res_bias = stream_ ? c.mm.param(res_bias_) : nullptr};
  const ResidualAffineRows<float> dw{.out_scale = c.grads + out_scale_, .out_bias = c.grads + out_bias_,
                                     .res_scale = stream_ ? c.grads + res_scale_ : nullptr,
                                     .res_bias = stream_ ? c.grads + res_bias_ : nullptr};
  residual_affine_backward(da, dstream, dw, a_, stream_ ? r : nullptr, w, c.d.N, c.d.C);
  return da;
}

}  // namespace atl::gpu
