// The elementwise steps between layers that have no layer of their own: the residual
// additions of the decoder. Device pointers.
#pragma once

#include <cstddef>

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// out[n] (=) a[n] + b[n]; out may alias a or b.
void add(float* out, const float* a, const float* b, size_t n, cudaStream_t stream = nullptr);

}  // namespace atl::gpu
