// Exact GELU (torch.nn.GELU's default, approximate="none"): out = x Φ(x) with Φ the standard
// normal CDF, Φ(x) = (1 + erf(x/√2)) / 2. ZAYA1's router MLP uses it.
#pragma once

#include <cstddef>

namespace atl {

// out[n] (=); out may alias x.
template <typename T>
void gelu_forward(T* out, const T* x, size_t n);

// dx[n] (=) dout * gelu'(x), gelu'(x) = Φ(x) + x φ(x), φ the standard normal density. dx may
// alias dout.
template <typename T>
void gelu_backward(T* dx, const T* dout, const T* x, size_t n);

}  // namespace atl
