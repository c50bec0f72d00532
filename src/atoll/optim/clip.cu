#include "atoll/optim/clip.cuh"

#include <cmath>

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"
#include "atoll/core/check.h"

namespace atl::gpu {
namespace {

// Blocks of the norm's first pass: fixed, so the summation order never changes.
constexpr int kNormBlocks = 512;

__global__ void sumsq_blocks_kernel(double* partial, const float* g, size_t n) {
  __shared__ double buf[kBlock];
  double acc = 0.0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    acc += double(g[i]) * double(g[i]);
  acc = block_sum(acc, buf);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sum_in_order_kernel(double* out, const double* partial, int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += partial[i];
  *out = s;
}

__global__ void scale_kernel(float* g, size_t n, float scale) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) g[i] *= scale;
}

}  // namespace

int64_t grad_norm_scratch_doubles() { return kNormBlocks + 1; }

double global_grad_norm(const float* g, size_t n, double* scratch, cudaStream_t stream) {
  if (n == 0) return 0.0;
  sumsq_blocks_kernel<<<kNormBlocks, kBlock, 0, stream>>>(scratch, g, n);
  ATOLL_CUDA_CHECK_LAUNCH();
  sum_in_order_kernel<<<1, 1, 0, stream>>>(scratch + kNormBlocks, scratch, kNormBlocks);
  ATOLL_CUDA_CHECK_LAUNCH();
  double sumsq = 0.0;
  ATOLL_CUDA_CHECK(cudaMemcpyAsync(&sumsq, scratch + kNormBlocks, sizeof(double), cudaMemcpyDeviceToHost, stream));
  ATOLL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return std::sqrt(sumsq);
}

double clip_grad_norm(float* g, size_t n, double max_norm, double* scratch, cudaStream_t stream) {
  ATOLL_CHECK_GE(max_norm, 0.0);
  const double norm = global_grad_norm(g, n, scratch, stream);
  if (max_norm == 0.0 || !std::isfinite(norm) || norm <= max_norm) return norm;
  scale_kernel<<<grid_for(n), kBlock, 0, stream>>>(g, n, float(max_norm / norm));
  ATOLL_CUDA_CHECK_LAUNCH();
  return norm;
}

}  // namespace atl::gpu
