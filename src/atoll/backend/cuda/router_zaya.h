// ZAYA1's router on the device, the steps with no other kernel (model/router_zaya.cu composes
// them with linear, bias, rmsnorm and gelu): semantics of layers/router_zaya.h (the choice
// over E1 = E + 1 classes, the last the skip class) and of model/router_zaya.cc (the depth
// averaging and the loads for bias balancing). Device pointers.
#pragma once

#include <cstdint>

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// probs[N,E1], choice[N,K] in [0, E1), gate[N,K], topk_idx[N,K] (all =): the choice of
// layers/router_zaya.h, and the expert ids for the experts part with the skip class as
// kNoExpert (-1: no expert computes that slot). One thread per token doing the CPU's loops in
// fp32, so it makes the same choices (ties to the lower index).
void zaya_route_forward(float* probs, int32_t* choice, float* gate, int32_t* topk_idx, const float* logits,
                        const float* biases, int N, int E1, int K, cudaStream_t stream = nullptr);

// dlogits[N,E1] (=) from dgate[N,K]; one thread per token, in double as the CPU.
void zaya_route_backward(float* dlogits, const float* dgate, const float* probs, const int32_t* choice, int N, int E1,
                         int K, cudaStream_t stream = nullptr);

// Depth averaging: s[N,R] (+=) s_prev[N,R] ⊙ scale[R].
void zaya_depth_forward(float* s, const float* s_prev, const float* scale, int N, int R, cudaStream_t stream = nullptr);

// dscale[R] (+=) the column sums of ds ⊙ s_prev (in double, a block per column: fixed order);
// dprev[N,R] (=) ds ⊙ scale, the gradient handed to the previous block's router.
void zaya_depth_backward(float* dscale, float* dprev, const float* ds, const float* s_prev, const float* scale, int N,
                         int R, cudaStream_t stream = nullptr);

// loads[E1] (+=) loss_scale * (slots of choice[N,K] that chose e) / (tokens*K): what the router
// leaves in its balancing row's gradient slot for bias balancing (optim/bias_balance.h). tokens
// is N, or under context parallelism the whole sequences' B·T, so that the group's loads add up
// to its batch's.
void zaya_class_loads(float* loads, const int32_t* choice, int N, int E1, int K, double loss_scale, double tokens,
                      cudaStream_t stream = nullptr);

}  // namespace atl::gpu
