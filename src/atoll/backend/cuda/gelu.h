// Exact GELU on the device; semantics of layers/gelu.h: out = x Φ(x), Φ(x) = (1 + erf(x/√2)) / 2.
// ZAYA1's router MLP uses it (model/router_zaya.cu). Device pointers.
#pragma once

#include <cstddef>

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// out[n] (=); out may alias x.
void gelu_forward(float* out, const float* x, size_t n, cudaStream_t stream = nullptr);

// dx[n] (=) dout * gelu'(x), gelu'(x) = Φ(x) + x φ(x); dx may alias dout.
void gelu_backward(float* dx, const float* dout, const float* x, size_t n, cudaStream_t stream = nullptr);

}  // namespace atl::gpu
