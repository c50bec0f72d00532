#include "atoll/backend/cuda/bias.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"

namespace atl::gpu {
namespace {

__global__ void add_bias_kernel(float* out, const float* b, size_t n, int OC) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] += b[i % OC];
}

// Block per column o.
__global__ void bias_backward_kernel(float* db, const float* dout, int N, int OC) {
  __shared__ double buf[kBlock];
  const int o = blockIdx.x;
  double acc = 0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) acc += dout[size_t(n) * OC + o];
  acc = block_sum(acc, buf);
  if (threadIdx.x == 0) db[o] += float(acc);
}

}  // namespace

void add_bias(float* out, const float* b, int N, int OC, cudaStream_t stream) {
  const size_t n = size_t(N) * OC;
  if (n == 0) return;
  add_bias_kernel<<<grid_for(n), kBlock, 0, stream>>>(out, b, n, OC);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void bias_backward(float* db, const float* dout, int N, int OC, cudaStream_t stream) {
  if (OC <= 0) return;
  bias_backward_kernel<<<OC, kBlock, 0, stream>>>(db, dout, N, OC);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
