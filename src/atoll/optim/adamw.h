// AdamW with decoupled weight decay, fused into one pass over a span of the flat buffers.
// Semantics are those of torch.optim.AdamW (Loshchilov & Hutter, https://arxiv.org/abs/1711.05101):
//   p *= 1 - lr*wd
//   m  = b1*m + (1-b1)*g
//   v  = b2*v + (1-b2)*g^2
//   p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
#pragma once

#include <cstddef>
#include <cstdint>

namespace atl {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled; the caller passes 0 for tensors that take none
};

// One AdamW step on n elements. params, m and v are updated in place; grads is read.
// `step` is the 1-based index of this step (t in the bias corrections). Every buffer has
// n elements: a tensor's span of the flat parameter, moment and gradient arrays.
void adamw_update(float* params, float* m, float* v, const float* grads, size_t n, int64_t step,
                  const AdamWOptions& opt);

}  // namespace atl
