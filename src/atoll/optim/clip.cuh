// Global gradient-norm clipping on the device; semantics of optim/clip.h: the norm in double,
// g scaled by float(max_norm / norm) when norm > max_norm, max_norm 0 = off, a non-finite norm
// leaves g as it was. Device pointers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// ||g||_2 over n elements: squares summed in double over a fixed grid of blocks, then the
// block sums in order (deterministic; equal to the CPU's to double rounding). Copies one
// double to the host, so it waits for the stream. scratch: grad_norm_scratch_doubles().
double global_grad_norm(const float* g, size_t n, double* scratch, cudaStream_t stream = nullptr);
int64_t grad_norm_scratch_doubles();

// Returns the norm before clipping, as clip_grad_norm in optim/clip.h.
double clip_grad_norm(float* g, size_t n, double max_norm, double* scratch, cudaStream_t stream = nullptr);

}  // namespace atl::gpu
