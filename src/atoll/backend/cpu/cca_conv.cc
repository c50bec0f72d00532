#include "atoll/backend/cpu/cca_conv.h"

#include <algorithm>
#include <vector>

#include "atoll/backend/cpu/gemm.h"

namespace atl::cpu {
namespace {

// W_gj[co,ci] = w1[g·HD+co, ci, j], stored [G, t1, HD, HD].
template <typename T>
std::vector<T> repack_grouped(const T* w1, const CcaDims& d) {
  const int G = d.NH + d.NKV, HD = d.HD, t1 = d.t1;
  std::vector<T> w(size_t(G) * t1 * HD * HD);
#pragma omp parallel for schedule(static)
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < t1; ++j)
      for (int co = 0; co < HD; ++co)
        for (int ci = 0; ci < HD; ++ci)
          w[((size_t(g) * t1 + j) * HD + co) * HD + ci] = w1[(size_t(g * HD + co) * HD + ci) * t1 + j];
  return w;
}

// The channels split into blocks of this many for the per-channel sums over tokens (each block
// one thread's, its sums in token order).
constexpr int kChannelBlock = 64;

}  // namespace

template <typename T>
void cca_conv_forward(T* z, T* y, const T* x, const T* w0, const T* b0, const T* w1, const T* b1, const CcaDims& d) {
  const int CC = d.CC(), TY = d.TY(), t0 = d.t0, t1 = d.t1, HD = d.HD, G = d.NH + d.NKV;
  const int lag = (t1 - 1) + (t0 - 1);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < d.B; ++b)
    for (int u = 0; u < TY; ++u) {
      T* yr = y + (size_t(b) * TY + u) * CC;
      std::copy(b0, b0 + CC, yr);
      for (int j = 0; j < t0; ++j) {
        const int tx = u - lag + j;
        if (tx < 0) continue;
        const T* xr = x + (size_t(b) * d.T + tx) * CC;
#pragma omp simd
        for (int c = 0; c < CC; ++c) yr[c] += w0[size_t(c) * t0 + j] * xr[c];
      }
    }
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < d.B; ++b)
    for (int t = 0; t < d.T; ++t) std::copy(b1, b1 + CC, z + (size_t(b) * d.T + t) * CC);
  const std::vector<T> w = repack_grouped(w1, d);
  for (int b = 0; b < d.B; ++b)
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < t1; ++j)
        gemm<T>(false, true, d.T, HD, HD, T(1), y + (size_t(b) * TY + j) * CC + size_t(g) * HD, CC,
                w.data() + (size_t(g) * t1 + j) * HD * HD, HD, T(1), z + size_t(b) * d.T * CC + size_t(g) * HD, CC);
}

template <typename T>
void cca_conv_backward(T* dx, T* dw0, T* db0, T* dw1, T* db1, T* dy, const T* dz, const T* y, const T* x,
                       const T* w0, const T* w1, const CcaDims& d) {
  const int CC = d.CC(), TY = d.TY(), t0 = d.t0, t1 = d.t1, HD = d.HD, G = d.NH + d.NKV;
  const int lag = (t1 - 1) + (t0 - 1);
  const std::vector<T> w = repack_grouped(w1, d);
  // The grouped convolution: dW_gj = Σ_b dz_gᵀ · y_gj (summed over the sequences in `acc`, then
  // added to dw1 once), dy_g[j ..] += dz_g · W_gj, db1 = the column sums of dz.
  std::vector<T> acc(w.size(), T(0));
  std::fill(dy, dy + size_t(d.B) * TY * CC, T(0));
  for (int b = 0; b < d.B; ++b)
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < t1; ++j) {
        const T* dzg = dz + size_t(b) * d.T * CC + size_t(g) * HD;
        const size_t yo = (size_t(b) * TY + j) * CC + size_t(g) * HD;
        T* wa = acc.data() + (size_t(g) * t1 + j) * HD * HD;
        gemm<T>(true, false, HD, HD, d.T, T(1), dzg, CC, y + yo, CC, T(1), wa, HD);
        gemm<T>(false, false, d.T, HD, HD, T(1), dzg, CC, w.data() + (size_t(g) * t1 + j) * HD * HD, HD, T(1),
                dy + yo, CC);
      }
#pragma omp parallel for schedule(static)
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < t1; ++j)
      for (int co = 0; co < HD; ++co)
        for (int ci = 0; ci < HD; ++ci)
          dw1[(size_t(g * HD + co) * HD + ci) * t1 + j] += acc[((size_t(g) * t1 + j) * HD + co) * HD + ci];
  const int blocks = (CC + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kChannelBlock, c1 = std::min(CC, c0 + kChannelBlock), n = c1 - c0;
    T sb1[kChannelBlock] = {}, sb0[kChannelBlock] = {}, sw0[kChannelBlock * 8] = {};
    std::vector<T> sw0_big(t0 > 8 ? size_t(t0) * n : 0, T(0));
    T* sw = t0 > 8 ? sw0_big.data() : sw0;  // [t0, n]
    for (int b = 0; b < d.B; ++b) {
      for (int t = 0; t < d.T; ++t) {
        const T* g = dz + (size_t(b) * d.T + t) * CC + c0;
        for (int i = 0; i < n; ++i) sb1[i] += g[i];
      }
      for (int u = 0; u < TY; ++u) {
        const T* g = dy + (size_t(b) * TY + u) * CC + c0;
        for (int i = 0; i < n; ++i) sb0[i] += g[i];
        for (int j = 0; j < t0; ++j) {
          const int tx = u - lag + j;
          if (tx < 0) continue;
          const T* xr = x + (size_t(b) * d.T + tx) * CC + c0;
          for (int i = 0; i < n; ++i) sw[size_t(j) * n + i] += g[i] * xr[i];
        }
      }
    }
    for (int i = 0; i < n; ++i) {
      db1[c0 + i] += sb1[i], db0[c0 + i] += sb0[i];
      for (int j = 0; j < t0; ++j) dw0[size_t(c0 + i) * t0 + j] += sw[size_t(j) * n + i];
    }
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < d.B; ++b)
    for (int tx = 0; tx < d.T; ++tx) {
      T* dxr = dx + (size_t(b) * d.T + tx) * CC;
      const T* rows[64];  // dy rows of the taps that read x at tx (t0 <= 64, the config's bound)
      int taps[64], n = 0;
      for (int j = 0; j < t0; ++j) {
        const int u = tx + lag - j;
        if (u < TY) rows[n] = dy + (size_t(b) * TY + u) * CC, taps[n++] = j;
      }
      for (int c = 0; c < CC; ++c) {
        T s = 0;
        for (int k = 0; k < n; ++k) s += rows[k][c] * w0[size_t(c) * t0 + taps[k]];
        dxr[c] += s;
      }
    }
}

template void cca_conv_forward<float>(float*, float*, const float*, const float*, const float*, const float*,
                                      const float*, const CcaDims&);
template void cca_conv_forward<double>(double*, double*, const double*, const double*, const double*, const double*,
                                       const double*, const CcaDims&);
template void cca_conv_backward<float>(float*, float*, float*, float*, float*, float*, const float*, const float*,
                                       const float*, const float*, const float*, const CcaDims&);
template void cca_conv_backward<double>(double*, double*, double*, double*, double*, double*, const double*,
                                        const double*, const double*, const double*, const double*, const CcaDims&);

}  // namespace atl::cpu
