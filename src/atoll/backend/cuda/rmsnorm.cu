#include "atoll/backend/cuda/rmsnorm.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"

namespace atl::gpu {
namespace {

__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* in, const float* weight, int C,
                                       float eps) {
  __shared__ float buf[kBlock];
  const size_t n = blockIdx.x;
  const float* x = in + n * C;
  float ss = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
  ss = block_sum(ss, buf);
  const float r = 1.f / sqrtf(ss / float(C) + eps);
  if (threadIdx.x == 0) rstd[n] = r;
  float* y = out + n * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = x[c] * r * weight[c];
}

// din += r * (g - xh * mean(g * xh)), g = dout * w, xh = x * r.
__global__ void rmsnorm_backward_input_kernel(float* din, const float* dout, const float* in, const float* rstd,
                                              const float* weight, int C) {
  __shared__ float buf[kBlock];
  const size_t n = blockIdx.x;
  const float* x = in + n * C;
  const float* dy = dout + n * C;
  float* dx = din + n * C;
  const float r = rstd[n];
  float dot = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) dot += dy[c] * weight[c] * x[c] * r;
  const float mean = block_sum(dot, buf) / float(C);
  for (int c = threadIdx.x; c < C; c += blockDim.x) dx[c] += r * (dy[c] * weight[c] - x[c] * r * mean);
}

// One thread per column; neighbouring threads read neighbouring columns (coalesced).
__global__ void rmsnorm_backward_weight_kernel(float* dweight, const float* dout, const float* in, const float* rstd,
                                               int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.f;
  for (int n = 0; n < N; ++n) acc += dout[size_t(n) * C + c] * in[size_t(n) * C + c] * rstd[n];
  dweight[c] += acc;
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int N, int C, double eps,
                     cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  rmsnorm_forward_kernel<<<N, kBlock, 0, stream>>>(out, rstd, in, weight, C, float(eps));
  ATOLL_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* rstd,
                      const float* weight, int N, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  rmsnorm_backward_input_kernel<<<N, kBlock, 0, stream>>>(din, dout, in, rstd, weight, C);
  ATOLL_CUDA_CHECK_LAUNCH();
  rmsnorm_backward_weight_kernel<<<grid_for(C), kBlock, 0, stream>>>(dweight, dout, in, rstd, N, C);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
