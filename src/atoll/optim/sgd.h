// Plain SGD with decoupled weight decay and no momentum (optim.name = "sgd"):
//   p = p * (1 - lr*wd) - lr * g
// Its use is the DiLoCo check "H = 1, fp32, outer lr 1, no momentum equals data parallel":
// SGD is linear in the gradient, so the mean over islands of their SGD steps is the SGD step
// on the mean gradient. AdamW is not (each island's step is a nonlinear function of its own
// gradient and moments), so with AdamW inner steps the two differ by more than rounding.
// docs/islands.md explains it in full.
#pragma once

#include <cstddef>

namespace atl {

struct SgdOptions {
  double lr = 1e-3;
  double weight_decay = 0.0;  // decoupled; the caller passes 0 for tensors that take none
};

// One SGD step on n elements: params updated in place, grads read.
void sgd_update(float* params, const float* grads, size_t n, const SgdOptions& opt);

}  // namespace atl
