#include "atoll/layers/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace atl {

namespace {

// dweight[c] += Σ over n, in order, of dout[n,c]·in[n,c]·rstd[n]: parallel over blocks of
// columns, serial over n. A block of columns walks the rows once: one column at a time would
// stride C through every row, and a row stride that is a multiple of 1 KiB maps the rows onto a
// few cache sets. Products are not fused into the sum (fp-contract off), so each column's sum is
// rounded as the plain loop rounds it and the gradients stay bit for bit what they were.
template <typename T>
__attribute__((optimize("fp-contract=off"))) void column_sums(T* dweight, const T* dout, const T* in, const T* rstd,
                                                             int N, int C) {
  constexpr int kCols = 16;
  const int blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < blocks; ++b) {
    const int c0 = b * kCols, width = std::min(kCols, C - c0);
    T acc[kCols] = {};
    for (int n = 0; n < N; ++n) {
      const T* dy = dout + size_t(n) * C + c0;
      const T* x = in + size_t(n) * C + c0;
      const T r = rstd[n];
      for (int c = 0; c < width; ++c) acc[c] += dy[c] * x[c] * r;
    }
    for (int c = 0; c < width; ++c) dweight[c0 + c] += acc[c];
  }
}

}  // namespace

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
  column_sums(dweight, dout, in, rstd, N, C);
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, double);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int, int);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*, const double*, const double*,
                                       int, int);

}  // namespace atl
