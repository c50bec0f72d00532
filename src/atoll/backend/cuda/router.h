// MoE router on the device; semantics of layers/router.h: p = softmax(logits), the top K by
// probability with ties to the lower index, weights renormalised to sum to 1. Device pointers.
#pragma once

#include <cstdint>

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// probs[N,E], lse[N], topk_idx[N,K], topk_w[N,K] (all =). One thread per token: E and K are
// small (tens to hundreds), and a thread doing the CPU's loops makes the same choices.
void router_forward(float* probs, float* lse, int32_t* topk_idx, float* topk_w, const float* logits, int N, int E,
                    int K, cudaStream_t stream = nullptr);

// out[2] (=) {aux, z}: the two auxiliary losses of this layer (layers/router.h router_losses),
// in double, left on the device so a step reads all layers' losses with one copy. Sums run
// over fixed slices of rows, then the slices in order: deterministic. scratch:
// router_losses_scratch_doubles(E) doubles. E at most 4096 (shared memory; checked).
void router_losses(double* out, const float* probs, const float* lse, const int32_t* topk_idx, int N, int E, int K,
                   double aux_coef, double z_coef, double* scratch, cudaStream_t stream = nullptr);
int64_t router_losses_scratch_doubles(int E);

// dlogits[N,E] (=) from dtopk_w[N,K] plus loss_scale times the gradients of the Switch
// load-balancing loss (aux_coef) and the z-loss (z_coef), as layers/router.cc (in double per
// token, like the CPU). scratch: E int32 (the per-expert routed counts f_i).
void router_backward(float* dlogits, const float* dtopk_w, const float* probs, const float* lse,
                     const int32_t* topk_idx, const float* topk_w, int N, int E, int K, double aux_coef, double z_coef,
                     double loss_scale, int32_t* scratch, cudaStream_t stream = nullptr);

// Context parallelism (a batch's tokens split over ranks; layers/router.h's RouterSums): out[2E+1]
// (=) in double, the sums these N tokens add to their batch's losses: routed slots per expert [E],
// Σ_n p_ne [E], Σ_n lse_n². Left on the device; scratch as router_losses. The ranks add theirs
// and take the losses from the total (router_losses(const RouterSums&, ...) on the host).
void router_sums(double* out, const float* probs, const float* lse, const int32_t* topk_idx, int N, int E, int K,
                 double* scratch, cudaStream_t stream = nullptr);

// router_backward for N tokens of a batch whose losses were taken over the whole batch (the
// RouterSums overload of layers/router.h): batch_counts[E] (device) the batch's routed slots per
// expert, batch_tokens its token count.
void router_backward_batch(float* dlogits, const float* dtopk_w, const float* probs, const float* lse,
                           const int32_t* topk_idx, const float* topk_w, int N, int E, int K, double aux_coef,
                           double z_coef, double loss_scale, const int32_t* batch_counts, double batch_tokens,
                           cudaStream_t stream = nullptr);

// counts[E] (+=) the slots of topk_idx[N,K] that chose each expert (kNoExpert slots count for
// none): the loads of Model::topk_choice_counts. A block per expert counts integers (exact).
void router_choice_counts(double* counts, const int32_t* topk_idx, int N, int E, int K, cudaStream_t stream = nullptr);

}  // namespace atl::gpu
