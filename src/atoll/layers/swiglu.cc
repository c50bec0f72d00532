#include "atoll/layers/swiglu.h"

#include <cmath>

namespace atl {

template <typename T>
void swiglu_forward(T* out, const T* a, const T* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-a[i]));
    out[i] = a[i] * s * b[i];
  }
}

template <typename T>
void swiglu_backward(T* da, T* db, const T* dout, const T* a, const T* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const T g = dout[i];
    const T s = T(1) / (T(1) + std::exp(-a[i]));
    const T silu = a[i] * s;
    db[i] = g * silu;
    da[i] = g * b[i] * s * (T(1) + a[i] * (T(1) - s));
  }
}

template void swiglu_forward<float>(float*, const float*, const float*, size_t);
template void swiglu_forward<double>(double*, const double*, const double*, size_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*, size_t);
template void swiglu_backward<double>(double*, double*, const double*, const double*, const double*, size_t);

}  // namespace atl
