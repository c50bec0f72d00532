// The SwiGLU elementwise loops, shared by the reference layer (layers/swiglu.cc) and the fused
// expert kernels (backend/cpu/expert_mlp.cc, a floor above), so both run the same arithmetic.
//   forward:  out = silu(a) * b,  silu(a) = a * sigmoid(a)
//   backward: db = dout * silu(a);  da = dout * b * s * (1 + a * (1 - s)),  s = sigmoid(a)
// da may alias dout (each element is read before it is written).
#pragma once

#include <cmath>
#include <cstddef>

#include "atoll/core/vector_math.h"

namespace atl {

template <typename T>
inline void swiglu_forward_kernel(T* out, const T* a, const T* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-a[i]));
    out[i] = a[i] * s * b[i];
  }
}

template <typename T>
inline void swiglu_backward_kernel(T* da, T* db, const T* dout, const T* a, const T* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T g = dout[i];
    const T s = T(1) / (T(1) + std::exp(-a[i]));
    const T silu = a[i] * s;
    db[i] = g * silu;
    da[i] = g * b[i] * s * (T(1) + a[i] * (T(1) - s));
  }
}

}  // namespace atl
