#include "atoll/dist/outer_delay.h"

#include <cmath>

namespace atl {

void eager_start(float* start, const float* theta, const float* momentum, const float* delta, size_t n, double lr,
                 double momentum_coef) {
  const float mu = static_cast<float>(momentum_coef), neg_lr = static_cast<float>(-lr);
  for (size_t i = 0; i < n; ++i) {
    const float m = std::fma(mu, momentum[i], delta[i]);
    const float u = std::fma(mu, m, delta[i]);
    start[i] = std::fma(neg_lr, u, theta[i]);
  }
}

}  // namespace atl
