// RMSNorm on the device; semantics of layers/rmsnorm.h. All pointers are device memory.
#pragma once

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// out[N,C] (=), rstd[N] (=). One block per row; sums of squares in fp32 (the CPU sums in double).
void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int N, int C, double eps,
                     cudaStream_t stream = nullptr);

// din[N,C] (+=), dweight[C] (+=). dweight sums over rows serially per column, in row order, as
// the CPU does, so it is deterministic.
void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* rstd,
                      const float* weight, int N, int C, cudaStream_t stream = nullptr);

}  // namespace atl::gpu
