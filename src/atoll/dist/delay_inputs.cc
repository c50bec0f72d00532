#include "atoll/dist/delay_inputs.h"

#include <algorithm>

namespace atl {

void DelayInputs::take(const DilocoSync& sync) {
  const size_t n = sync.plan().total;
  if (sync.options().ring.error_feedback) residual_.resize(n), sync.residual(residual_.data());
  if (sync.sends_sparse()) expert_residual_.resize(n), sync.expert_residual(expert_residual_.data());
  held_ = true;
}

void DelayInputs::read(const DilocoSync& sync, Residual which, bool in_flight, float* out) const {
  const bool ring = which == Residual::kRing;
  if (in_flight && held_) {
    const std::vector<float>& copy = ring ? residual_ : expert_residual_;
    std::copy(copy.begin(), copy.end(), out);
  } else if (ring) {
    sync.residual(out);
  } else {
    sync.expert_residual(out);
  }
}

}  // namespace atl
