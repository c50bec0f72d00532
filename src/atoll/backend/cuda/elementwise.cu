#include "atoll/backend/cuda/elementwise.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"

namespace atl::gpu {
namespace {

__global__ void add_kernel(float* out, const float* a, const float* b, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

}  // namespace

void add(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kBlock, 0, stream>>>(out, a, b, n);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
