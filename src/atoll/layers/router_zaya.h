// The choice of ZAYA1's router (transformers' ZayaRouter, after its MLP): over E1 = E + 1
// classes, the last one the skip class (mixture of depths: the token bypasses the experts),
//   p      = softmax(logits)                                   [N,E1]
//   choice = the top K of p + biases (ties to the lower index)   [N,K]   biases [E1]
//   gate   = p[choice], and 0 where choice is the skip class    [N,K]
// The balancing biases choose the experts but never enter the gate: the gate is the unbiased
// probability, not renormalised over the K chosen. Selection is piecewise constant, so no
// gradient flows through which classes were chosen (nor to the biases); a skipped slot has no
// gradient (its gate is the constant 0).
#pragma once

#include <cstdint>

namespace atl {

// probs[N,E1] (=), choice[N,K] (=) in [0, E1), gate[N,K] (=).
template <typename T>
void zaya_route_forward(T* probs, int32_t* choice, T* gate, const T* logits, const T* biases, int N, int E1,
                        int K);

// dlogits[N,E1] (=) from dgate[N,K].
template <typename T>
void zaya_route_backward(T* dlogits, const T* dgate, const T* probs, const int32_t* choice, int N, int E1, int K);

// counts[E1] (=) of the chosen classes over the N*K slots (the skip class last).
void zaya_class_counts(int64_t* counts, const int32_t* choice, int N, int E1, int K);

}  // namespace atl
