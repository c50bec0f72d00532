#include "atoll/optim/sgd.h"

#include <cstdint>

namespace atl {

static constexpr size_t kParallelMin = size_t{1} << 15;  // as adamw.cc: small spans stay serial

void sgd_update(float* params, const float* grads, size_t n, const SgdOptions& opt) {
  const float decay = static_cast<float>(1.0 - opt.lr * opt.weight_decay);
  const float lr = static_cast<float>(opt.lr);
  const int64_t nn = static_cast<int64_t>(n);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < nn; ++i) params[i] = params[i] * decay - lr * grads[i];
}

}  // namespace atl
