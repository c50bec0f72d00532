// SwiGLU gate on the device; semantics of layers/swiglu.h. Device pointers.
#pragma once

#include <cstddef>

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// out[n] (=) silu(a) * b.
void swiglu_forward(float* out, const float* a, const float* b, size_t n, cudaStream_t stream = nullptr);

// da[n], db[n] (=). da may alias dout (each element is read before it is written).
void swiglu_backward(float* da, float* db, const float* dout, const float* a, const float* b, size_t n,
                     cudaStream_t stream = nullptr);

}  // namespace atl::gpu
