// Token embedding: out[n] = wte[tokens[n]].
#pragma once

#include <cstdint>

namespace atl {

// out[N,C] (=) rows of wte[V,C]; tokens[N] must lie in [0, V) (checked).
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C, int V);

// dwte[V,C] (+=) the rows of dout[N,C] at their tokens, serially, so repeated tokens add in
// a fixed order (bit-reproducible).
template <typename T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C);

}  // namespace atl
