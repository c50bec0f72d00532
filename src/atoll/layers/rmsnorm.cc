#include "atoll/layers/rmsnorm.h"

#include <cmath>
#include <cstddef>

namespace atl {

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* in, const T* weight, int N, int C, double eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = in + size_t(n) * C;
    T* y = out + size_t(n) * C;
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += double(x[c]) * x[c];
    const T r = T(1.0 / std::sqrt(ss / C + eps));
    rstd[n] = r;
    for (int c = 0; c < C; ++c) y[c] = x[c] * r * weight[c];
  }
}

template <typename T>
void rmsnorm_backward(T* din, T* dweight, const T* dout, const T* in, const T* rstd, const T* weight, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = in + size_t(n) * C;
    const T* dy = dout + size_t(n) * C;
    T* dx = din + size_t(n) * C;
    const T r = rstd[n];
    double dot = 0.0;  // sum over c of (dy*w) * (x*r)
    for (int c = 0; c < C; ++c) dot += double(dy[c]) * weight[c] * x[c] * r;
    const T mean = T(dot / C);
    for (int c = 0; c < C; ++c) dx[c] += r * (dy[c] * weight[c] - x[c] * r * mean);
  }
  // Column sums in a fixed order: parallel over c, serial over n.
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; ++c) {
    T acc = 0;
    for (int n = 0; n < N; ++n) acc += dout[size_t(n) * C + c] * in[size_t(n) * C + c] * rstd[n];
    dweight[c] += acc;
  }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, double);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int, int);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*, const double*, const double*,
                                       int, int);

}  // namespace atl
