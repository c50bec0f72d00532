#include "atoll/dist/outer_delay.h"

#include <algorithm>
#include <cmath>

#include "atoll/core/check.h"

namespace atl {

bool OuterDelay::pending() const { return std::find(pending_.begin(), pending_.end(), true) != pending_.end(); }

void OuterDelay::set_pending_list(const std::vector<bool>& p) {
  ATOLL_CHECK(p.size() == pending_.size()) << "pending flags of " << p.size() << " fragments, not " << pending_.size();
  pending_ = p;
}

void OuterDelay::keep_delta(DilocoSync& sync, int f) {
  if (plan_.count() == 1) return;  // layout_delta() is Δ_0 itself
  sync.unpack(f, sync.delta(f).data(), delta_.data());
}

void OuterDelay::restore_deltas(DilocoSync& sync) const {
  if (plan_.count() == 1) return;
  for (int f = 0; f < plan_.count(); ++f) sync.pack(f, delta_.data(), sync.delta(f).data(), 0, sync.delta(f).size());
}

void OuterDelay::round_start(const std::vector<float>& theta, float* out) const {
  for (int f = 0; f < plan_.count(); ++f) {
    const float* from = round_start(f, theta);
    for (const ElementRange& r : plan_.ranges[size_t(f)]) std::copy(from + r.begin, from + r.end, out + r.begin);
  }
}

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
