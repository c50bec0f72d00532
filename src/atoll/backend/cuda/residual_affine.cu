#include "atoll/backend/cuda/residual_affine.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"

namespace atl::gpu {
namespace {

__global__ void residual_affine_forward_kernel(float* out, const float* a, const float* r,
                                               ResidualAffineRows<const float> w, size_t n, int C) {
  const size_t k = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const int i = int(k % C);
  float y = (a[k] + w.out_bias[i]) * w.out_scale[i];
  if (r) y += (r[k] + w.res_bias[i]) * w.res_scale[i];
  out[k] = y;
}

// Block per channel i: its four column sums, then its column of da and dstream.
__global__ void residual_affine_backward_kernel(float* da, float* dstream, ResidualAffineRows<float> dw, const float* a,
                                                const float* r, ResidualAffineRows<const float> w, int N, int C) {
  __shared__ double buf[kBlock];
  const int i = blockIdx.x;
  const float as = w.out_scale[i], ab = w.out_bias[i];
  const float rs = r ? w.res_scale[i] : 0.f, rb = r ? w.res_bias[i] : 0.f;
  double s_as = 0, s_g = 0, s_rs = 0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    const size_t k = size_t(n) * C + i;
    const double g = dstream[k];
    s_as += g * (a[k] + ab), s_g += g;
    if (r) s_rs += g * (r[k] + rb);
    da[k] = dstream[k] * as;
    if (r) dstream[k] *= rs;
  }
  s_as = block_sum(s_as, buf);
  s_g = block_sum(s_g, buf);
  if (r) s_rs = block_sum(s_rs, buf);  // uniform over the block: every thread takes this branch or none
  if (threadIdx.x != 0) return;
  dw.out_scale[i] += float(s_as), dw.out_bias[i] += float(s_g * as);
  if (r) dw.res_scale[i] += float(s_rs), dw.res_bias[i] += float(s_g * rs);
}

}  // namespace

void residual_affine_forward(float* out, const float* a, const float* r, const ResidualAffineRows<const float>& w,
                             int N, int C, cudaStream_t stream) {
  const size_t n = size_t(N) * C;
  if (n == 0) return;
  residual_affine_forward_kernel<<<grid_for(n), kBlock, 0, stream>>>(out, a, r, w, n, C);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void residual_affine_backward(float* da, float* dstream, const ResidualAffineRows<float>& dw, const float* a,
                              const float* r, const ResidualAffineRows<const float>& w, int N, int C,
                              cudaStream_t stream) {
  if (C <= 0) return;
  residual_affine_backward_kernel<<<C, kBlock, 0, stream>>>(da, dstream, dw, a, r, w, N, C);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
