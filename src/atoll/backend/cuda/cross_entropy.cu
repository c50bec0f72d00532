#include "atoll/backend/cuda/cross_entropy.h"

#include <cmath>

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"

namespace atl::gpu {
namespace {

// Block per row. Each thread keeps (m, s) over the columns it visits (v = tid, tid + 256, ...);
// the block then takes the max M and sums s·exp(m − M).
__global__ void cross_entropy_forward_kernel(float* loss, float* lse, const float* logits, const int32_t* targets,
                                             int V) {
  __shared__ float buf[kBlock];
  const size_t n = blockIdx.x;
  const float* x = logits + n * V;
  float m = -INFINITY, s = 0.f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float xv = x[v];
    if (xv > m) {
      s = s * expf(m - xv) + 1.f;  // exp(-inf) = 0 on the first element
      m = xv;
    } else {
      s += expf(xv - m);
    }
  }
  const float M = block_max(m, buf);
  const float part = s == 0.f ? 0.f : s * expf(m - M);  // threads with no column have m = -inf
  const float l = M + logf(block_sum(part, buf));
  if (threadIdx.x == 0) {
    lse[n] = l;
    const int32_t t = targets[n];
    loss[n] = t >= 0 && t < V ? l - x[t] : NAN;
  }
}

// Grid (column chunk, row); each element is read then written by one thread, so in place works.
__global__ void cross_entropy_backward_kernel(float* dlogits, const float* logits, const float* lse,
                                              const int32_t* targets, int V, float scale) {
  const size_t n = blockIdx.y;
  const int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= V) return;
  float d = scale * expf(logits[n * V + v] - lse[n]);
  if (v == targets[n]) d -= scale;
  dlogits[n * V + v] = d;
}

}  // namespace

void cross_entropy_forward(float* loss, float* lse, const float* logits, const int32_t* targets, int N, int V,
                           cudaStream_t stream) {
  if (N <= 0 || V <= 0) return;
  cross_entropy_forward_kernel<<<N, kBlock, 0, stream>>>(loss, lse, logits, targets, V);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets, int N, int V,
                            float scale, cudaStream_t stream) {
  if (N <= 0 || V <= 0) return;
  // Rows on grid y (at most 65535 per launch), so long batches go in slices of rows.
  constexpr int kMaxRows = 65535;
  for (int n0 = 0; n0 < N; n0 += kMaxRows) {
    const int rows = N - n0 < kMaxRows ? N - n0 : kMaxRows;
    const size_t off = size_t(n0) * V;
    cross_entropy_backward_kernel<<<dim3(grid_for(V), rows), kBlock, 0, stream>>>(dlogits + off, logits + off, lse + n0,
                                                                                  targets + n0, V, scale);
    ATOLL_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace atl::gpu
