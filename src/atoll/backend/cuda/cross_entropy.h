// Cross-entropy of logits against next tokens on the device; semantics of
// layers/cross_entropy.h. One block per row walks the vocabulary in chunks of the block's
// width with an online log-sum-exp (a running max and a sum rescaled when the max grows), so
// V need not be a multiple of anything and the logits are read once. Device pointers.
#pragma once

#include <cstdint>

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// loss[N] (=) lse_n − logits[n, target_n] (the caller sums; the CPU returns the sum), lse[N] (=).
// A target outside [0, V) gives a NaN loss for its row (kernels cannot throw; check_ids checks).
void cross_entropy_forward(float* loss, float* lse, const float* logits, const int32_t* targets, int N, int V,
                           cudaStream_t stream = nullptr);

// dlogits[N,V] (=) scale * (softmax(logits) − onehot(target)). May alias logits (in place).
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets, int N, int V,
                            float scale, cudaStream_t stream = nullptr);

}  // namespace atl::gpu
