#include "atoll/backend/cuda/swiglu.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"

namespace atl::gpu {
namespace {

__device__ inline float sigmoid(float a) { return 1.f / (1.f + expf(-a)); }

__global__ void swiglu_forward_kernel(float* out, const float* a, const float* b, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * sigmoid(a[i]) * b[i];
}

__global__ void swiglu_backward_kernel(float* da, float* db, const float* dout, const float* a, const float* b,
                                       size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = dout[i], ai = a[i], bi = b[i];
  const float s = sigmoid(ai);
  db[i] = g * ai * s;
  da[i] = g * bi * s * (1.f + ai * (1.f - s));
}

}  // namespace

void swiglu_forward(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n), kBlock, 0, stream>>>(out, a, b, n);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(float* da, float* db, const float* dout, const float* a, const float* b, size_t n,
                     cudaStream_t stream) {
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n), kBlock, 0, stream>>>(da, db, dout, a, b, n);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
