// ZAYA1's residual scaling on the device; semantics of model/norm_residual.h's ResidualMerge
// (transformers' ZayaResidualScaling, bias before scale), per channel [C]:
//   out = (a + a_bias) ⊙ a_scale + (r + r_bias) ⊙ r_scale
// where a is a sub-layer's output and r the residual stream; without a stream (after the
// embedding) out = (a + a_bias) ⊙ a_scale. Device pointers.
#pragma once

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// The rows [C] each; res_scale and res_bias null without a stream. The same shape holds their
// gradients.
template <typename F>
struct ResidualAffineRows {
  F* out_scale = nullptr;
  F* out_bias = nullptr;
  F* res_scale = nullptr;
  F* res_bias = nullptr;
};

// out[N,C] (=) from a[N,C] and r[N,C] (null without a stream); out may alias a or r.
void residual_affine_forward(float* out, const float* a, const float* r, const ResidualAffineRows<const float>& w,
                             int N, int C, cudaStream_t stream = nullptr);

// From g = dstream[N,C] = d(out): the rows' gradients (+=), column sums in double (a block per
// channel: a fixed order), d(a_scale) = Σ g (a + a_bias), d(a_bias) = a_scale Σ g, and the
// same for the stream's; da[N,C] (=) g ⊙ a_scale; dstream (in place) g ⊙ r_scale (left alone
// without a stream). a and r as in forward.
void residual_affine_backward(float* da, float* dstream, const ResidualAffineRows<float>& dw, const float* a,
                              const float* r, const ResidualAffineRows<const float>& w, int N, int C,
                              cudaStream_t stream = nullptr);

}  // namespace atl::gpu
