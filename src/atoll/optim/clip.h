// Global gradient-norm clipping over the flat gradient buffer (Pascanu et al., 2013).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace atl {

// ||g||_2 over n elements, accumulated in double. Partial sums are taken over fixed blocks and
// added in block order, so the result is the same for every thread count.
double global_grad_norm(const float* g, size_t n);

// Scales g by max_norm/norm when norm > max_norm and returns the norm before clipping.
// max_norm 0 turns clipping off (the norm is still returned). A non-finite norm leaves g as
// it was, for the caller to skip the step or roll back: scaling would spread the NaN.
// `left_out` spans {offset, count} of g are not gradients (a router's loads in the slots of its
// balancing biases, optim/bias_balance.h): the norm leaves them out (their squares subtracted,
// in double); the scaling covers them, which their readers do not mind (they use ratios).
double clip_grad_norm(float* g, size_t n, double max_norm,
                      const std::vector<std::pair<size_t, size_t>>& left_out = {});

// The parts of clip_grad_norm for a gradient held in shards (ZeRO-1, optim/zero_shard.h): this
// shard's sum of squares in double (blocks in order, as global_grad_norm) less the left_out
// spans', whose sum over the shards is the squared norm; then g *= max_norm/norm when the norm
// is finite and above max_norm (0 = off).
double grad_sumsq(const float* g, size_t n, const std::vector<std::pair<size_t, size_t>>& left_out = {});
void clip_to_norm(float* g, size_t n, double max_norm, double norm);

}  // namespace atl
