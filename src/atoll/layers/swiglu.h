// SwiGLU gate: out = silu(a) * b, silu(a) = a * sigmoid(a).
#pragma once

#include <cstddef>

namespace atl {

// out[n] (=).
template <typename T>
void swiglu_forward(T* out, const T* a, const T* b, size_t n);

// da[n], db[n] (=): da = dout * b * silu'(a), db = dout * silu(a), with
// silu'(a) = s (1 + a (1 − s)), s = sigmoid(a). da may alias dout (read before written).
template <typename T>
void swiglu_backward(T* da, T* db, const T* dout, const T* a, const T* b, size_t n);

}  // namespace atl
