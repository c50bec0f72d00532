// MoE router (Mixtral): p = softmax(logits) over E experts; the top K by probability (ties
// to the lower index), weights renormalised to sum to 1 (or, with renormalize false, the chosen
// probabilities as they are: transformers' norm_topk_prob = false). Auxiliary losses, per layer:
//   Switch load balancing  aux = coef * E * Σ_i f_i P_i, f_i = share of the N*K routed slots
//                          that went to expert i (no gradient), P_i = mean_n p_ni;
//   router z-loss          z = coef * mean_n logsumexp(logits_n)².
#pragma once

#include <cstdint>
#include <vector>

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

// The sums over tokens that the auxiliary losses are made of: slots[E] routed slots per
// expert, prob[E] = Σ_n p_ni, z = Σ_n lse_n², over `tokens` tokens. Sums of disjoint sets of
// tokens add up (element by element), so ranks holding parts of one batch (context parallelism)
// add theirs and take the batch's losses and gradients from the total.
struct RouterSums {
  std::vector<double> slots, prob;  // [E]
  double z = 0.0, tokens = 0.0;
  void add(const RouterSums& o);
};
template <typename T>
RouterSums router_sums(const T* probs, const T* lse, const int32_t* topk_idx, int N, int E, int K);
// The losses of a batch with these sums (router_losses is this over the batch's own).
RouterLosses router_losses(const RouterSums& s, int K, double aux_coef, double z_coef);

// dlogits[N,E] (=) from dtopk_w[N,K] (the combine's gradient) plus `loss_scale` times the
// gradients of the auxiliary losses. Top-k selection is piecewise constant: no gradient
// flows through which experts were chosen, only through their probabilities.
template <typename T>
void router_backward(T* dlogits, const T* dtopk_w, const T* probs, const T* lse, const int32_t* topk_idx,
                     const T* topk_w, int N, int E, int K, double aux_coef, double z_coef, double loss_scale,
                     bool renormalize = true);
// The same for N of the batch's tokens, whose losses were taken from `batch`, the sums over the
// whole batch (its slot shares f_i and its token count): the gradients of every part of a batch
// add up to the whole batch's.
template <typename T>
void router_backward(T* dlogits, const T* dtopk_w, const T* probs, const T* lse, const int32_t* topk_idx,
                     const T* topk_w, int N, int E, int K, double aux_coef, double z_coef, double loss_scale,
                     bool renormalize, const RouterSums& batch);

}  // namespace atl
