// Cross-entropy of logits against next tokens. The model calls it on chunks of rows so the
// full [N,V] logits never exist at once (model.cc); these functions see one chunk.
#pragma once

#include <cstdint>

namespace atl {

// Returns Σ_n (lse_n − logits[n, target_n]) over the N rows; lse[N] (=) if non-null.
// targets must lie in [0, V) (checked).
template <typename T>
double cross_entropy_forward(T* lse, const T* logits, const int32_t* targets, int N, int V);

// dlogits[N,V] (=) scale * (softmax(logits) − onehot(target)). May alias logits (in place).
template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets, int N, int V, T scale);

}  // namespace atl
