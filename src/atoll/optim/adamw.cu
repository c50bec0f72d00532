#include "atoll/optim/adamw.cuh"

#include <cmath>

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"
#include "atoll/core/check.h"

namespace atl::gpu {
namespace {

struct AdamWScalars {
  float decay, step_size, bc2_sqrt, b1, one_minus_b1, b2, one_minus_b2, eps;
};

// The _rn intrinsics round each operation and keep the compiler from contracting a*b+c into
// an FMA, which the host build (-std=c++20, so -ffp-contract=off) never does either.
__global__ void adamw_kernel(float* params, float* m, float* v, const float* grads, size_t n, AdamWScalars s) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = grads[i];
  const float mi = __fadd_rn(__fmul_rn(s.b1, m[i]), __fmul_rn(s.one_minus_b1, g));
  const float vi = __fadd_rn(__fmul_rn(s.b2, v[i]), __fmul_rn(__fmul_rn(s.one_minus_b2, g), g));
  m[i] = mi;
  v[i] = vi;
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
  params[i] = __fsub_rn(__fmul_rn(params[i], s.decay), __fdiv_rn(__fmul_rn(s.step_size, mi), denom));
}

}  // namespace

void adamw_update(float* params, float* m, float* v, const float* grads, size_t n, int64_t step,
                  const AdamWOptions& opt, cudaStream_t stream) {
  ATOLL_CHECK_GE(step, 1) << "AdamW steps count from 1 (bias correction)";
  if (n == 0) return;
  // Formed exactly as optim/adamw.cc forms them.
  const double bc1 = 1.0 - std::pow(opt.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(opt.beta2, static_cast<double>(step));
  const AdamWScalars s{
      .decay = static_cast<float>(1.0 - opt.lr * opt.weight_decay),
      .step_size = static_cast<float>(opt.lr / bc1),
      .bc2_sqrt = static_cast<float>(std::sqrt(bc2)),
      .b1 = static_cast<float>(opt.beta1),
      .one_minus_b1 = static_cast<float>(1.0 - opt.beta1),
      .b2 = static_cast<float>(opt.beta2),
      .one_minus_b2 = static_cast<float>(1.0 - opt.beta2),
      .eps = static_cast<float>(opt.eps),
  };
  adamw_kernel<<<grid_for(n), kBlock, 0, stream>>>(params, m, v, grads, n, s);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
