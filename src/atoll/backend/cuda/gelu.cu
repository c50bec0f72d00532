#include "atoll/backend/cuda/gelu.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"

namespace atl::gpu {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

__global__ void gelu_forward_kernel(float* out, const float* x, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] * 0.5f * (1.f + erff(x[i] * kInvSqrt2));
}

__global__ void gelu_backward_kernel(float* dx, const float* dout, const float* x, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  const float cdf = 0.5f * (1.f + erff(v * kInvSqrt2));
  const float pdf = kInvSqrt2Pi * expf(-0.5f * v * v);
  dx[i] = dout[i] * (cdf + v * pdf);
}

}  // namespace

void gelu_forward(float* out, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n), kBlock, 0, stream>>>(out, x, n);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void gelu_backward(float* dx, const float* dout, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n), kBlock, 0, stream>>>(dx, dout, x, n);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
