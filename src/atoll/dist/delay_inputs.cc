#include "atoll/dist/delay_inputs.h"

#include <algorithm>

namespace atl {

void DelayInputs::take(const DilocoSync& sync, int f) {
  const size_t n = sync.plan().total;
  if (sync.options().ring.error_feedback) residual_.resize(n), sync.residual(residual_.data(), f);
  if (sync.sends_sparse()) expert_residual_.resize(n), sync.expert_residual(expert_residual_.data(), f);
  held_.resize(size_t(sync.fragments()), false);
  held_[size_t(f)] = true;
}

void DelayInputs::take(const DilocoSync& sync) {
  for (int f = 0; f < sync.fragments(); ++f) take(sync, f);
}

void DelayInputs::read(const DilocoSync& sync, Residual which, const std::vector<bool>& in_flight, float* out) const {
  const bool ring = which == Residual::kRing;
  const std::vector<float>& copy = ring ? residual_ : expert_residual_;
  for (int f = 0; f < sync.fragments(); ++f) {
    if (in_flight[size_t(f)] && size_t(f) < held_.size() && held_[size_t(f)]) {
      for (const ElementRange& r : sync.plan().ranges[size_t(f)])
        std::copy(copy.begin() + std::ptrdiff_t(r.begin), copy.begin() + std::ptrdiff_t(r.end), out + r.begin);
    } else if (ring) {
      sync.residual(out, f);
    } else {
      sync.expert_residual(out, f);
    }
  }
}

}  // namespace atl
