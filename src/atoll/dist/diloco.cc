#include "atoll/dist/diloco.h"

#include <xxhash.h>

#include <cmath>
#include <cstdio>

#include "atoll/core/check.h"
#include "atoll/core/timer.h"

namespace atl {

DilocoSync::DilocoSync(ProcessGroup& outer, const float* theta0, size_t n, const DilocoOptions& opts)
    : opts_(opts), ring_(outer, opts.ring), theta_(theta0, theta0 + n), momentum_(n, 0.0f), delta_(n, 0.0f) {
  ATOLL_CHECK_GE(opts.inner_steps, 1);
}

bool DilocoSync::due(int64_t step, int64_t last_step) const {
  return step > 0 && (step % opts_.inner_steps == 0 || step == last_step);
}

void outer_nesterov_step(float* theta, float* momentum, const float* mean_delta, size_t n, double lr,
                         double momentum_coef) {
  const float mu = static_cast<float>(momentum_coef), neg_lr = static_cast<float>(-lr);
  for (size_t i = 0; i < n; ++i) {
    const float m = std::fma(mu, momentum[i], mean_delta[i]);
    const float u = std::fma(mu, m, mean_delta[i]);
    momentum[i] = m;
    theta[i] = std::fma(neg_lr, u, theta[i]);
  }
}

SyncResult DilocoSync::sync(float* theta_local) {
  const double t0 = now_s();
  const uint64_t sent_before = ring_.stats().bytes_sent;
  const size_t n = theta_.size();
  for (size_t i = 0; i < n; ++i) delta_[i] = theta_[i] - theta_local[i];
  ring_.mean(delta_.data(), n);  // throws before anything of ours changed
  outer_nesterov_step(theta_.data(), momentum_.data(), delta_.data(), n, opts_.outer_lr, opts_.outer_momentum);
  std::copy(theta_.begin(), theta_.end(), theta_local);
  ++outer_step_;
  return {.outer_step = outer_step_,
          .theta_hash = theta_hash(),
          .bytes_sent = ring_.stats().bytes_sent - sent_before,
          .seconds = now_s() - t0};
}

std::string hash_floats(const float* x, size_t n) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits(x, n * sizeof(float))));
  return buf;
}

std::string DilocoSync::theta_hash() const { return hash_floats(theta_.data(), theta_.size()); }

}  // namespace atl
