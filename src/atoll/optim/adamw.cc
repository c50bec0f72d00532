#include "atoll/optim/adamw.h"

#include <cmath>

#include "atoll/core/check.h"

namespace atl {

// Spans smaller than this run on the calling thread: a parallel region costs more than the
// pass itself for a norm gain of a few hundred elements.
static constexpr size_t kParallelMin = size_t{1} << 15;

void adamw_update(float* params, float* m, float* v, const float* grads, size_t n, int64_t step,
                  const AdamWOptions& opt) {
  ATOLL_CHECK_GE(step, 1) << "AdamW steps count from 1 (bias correction)";
  // The scalars are formed in double, as PyTorch forms them in Python floats, then rounded
  // once; the per-element arithmetic is fp32 like the buffers.
  const double bc1 = 1.0 - std::pow(opt.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(opt.beta2, static_cast<double>(step));
  const float decay = static_cast<float>(1.0 - opt.lr * opt.weight_decay);
  const float step_size = static_cast<float>(opt.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float b1 = static_cast<float>(opt.beta1), one_minus_b1 = static_cast<float>(1.0 - opt.beta1);
  const float b2 = static_cast<float>(opt.beta2), one_minus_b2 = static_cast<float>(1.0 - opt.beta2);
  const float eps = static_cast<float>(opt.eps);
  // Each element is independent, so the result does not depend on the thread count.
  const int64_t nn = static_cast<int64_t>(n);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < nn; ++i) {
    const float g = grads[i];
    const float mi = b1 * m[i] + one_minus_b1 * g;
    const float vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    params[i] = params[i] * decay - step_size * mi / denom;
  }
}

}  // namespace atl
