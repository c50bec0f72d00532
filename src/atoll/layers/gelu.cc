#include "atoll/layers/gelu.h"

#include <cmath>

namespace atl {

template <typename T>
void gelu_forward(T* out, const T* x, size_t n) {
  const T r2 = T(1) / std::sqrt(T(2));
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) out[i] = x[i] * T(0.5) * (T(1) + std::erf(x[i] * r2));
}

template <typename T>
void gelu_backward(T* dx, const T* dout, const T* x, size_t n) {
  const T r2 = T(1) / std::sqrt(T(2)), inv_sqrt_2pi = T(0.3989422804014327);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    const T cdf = T(0.5) * (T(1) + std::erf(x[i] * r2));
    const T pdf = inv_sqrt_2pi * std::exp(T(-0.5) * x[i] * x[i]);
    dx[i] = dout[i] * (cdf + x[i] * pdf);
  }
}

template void gelu_forward<float>(float*, const float*, size_t);
template void gelu_forward<double>(double*, const double*, size_t);
template void gelu_backward<float>(float*, const float*, const float*, size_t);
template void gelu_backward<double>(double*, const double*, const double*, size_t);

}  // namespace atl
