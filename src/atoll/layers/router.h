// MoE router (Mixtral): p = softmax(logits) over E experts; the top K by probability (ties
// to the lower index), weights renormalised to sum to 1 (or, with renormalize false, the chosen
// probabilities as they are: transformers' norm_topk_prob = false). Auxiliary losses, per layer:
//   Switch load balancing  aux = coef * E * Σ_i f_i P_i, f_i = share of the N*K routed slots
//                          that went to expert i (no gradient), P_i = mean_n p_ni;
//   router z-loss          z = coef * mean_n logsumexp(logits_n)².
#pragma once

#include <cstdint>

namespace atl {

struct RouterLosses {
  double aux = 0.0;
  double z = 0.0;
};

// probs[N,E] (=), lse[N] (=) logsumexp of each logits row, topk_idx[N,K] (=), topk_w[N,K] (=).
template <typename T>
void router_forward(T* probs, T* lse, int32_t* topk_idx, T* topk_w, const T* logits, int N, int E, int K,
                    bool renormalize = true);

// The two auxiliary losses of this layer for the routing above.
template <typename T>
RouterLosses router_losses(const T* probs, const T* lse, const int32_t* topk_idx, int N, int E, int K,
                           double aux_coef, double z_coef);

// dlogits[N,E] (=) from dtopk_w[N,K] (the combine's gradient) plus `loss_scale` times the
// gradients of the auxiliary losses. Top-k selection is piecewise constant: no gradient
// flows through which experts were chosen, only through their probabilities.
template <typename T>
void router_backward(T* dlogits, const T* dtopk_w, const T* probs, const T* lse, const int32_t* topk_idx,
                     const T* topk_w, int N, int E, int K, double aux_coef, double z_coef, double loss_scale,
                     bool renormalize = true);

}  // namespace atl
