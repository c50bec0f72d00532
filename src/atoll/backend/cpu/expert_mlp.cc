#include "atoll/backend/cpu/expert_mlp.h"

#include <cmath>
#include <cstring>

#include "atoll/backend/cpu/gemm.h"
#include "atoll/layers/swiglu_kernel.h"

namespace atl {
namespace {

template <typename T>
void gather(T* out, const T* in, const int32_t* row_token, int n, int C) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n; ++r) std::memcpy(out + size_t(r) * C, in + size_t(row_token[r]) * C, sizeof(T) * C);
}

}  // namespace

template <typename T>
void expert_mlp_forward_fused(T* out, T* a, T* b, const ExpertChunk<T>& s, const T* x, const int32_t* row_token,
                              const T* w_row, const T* w1, const T* w3, const T* w2, const int32_t* offsets, int N,
                              int E, int C, int H) {
  const size_t WH = size_t(H) * C;
  std::memset(out, 0, sizeof(T) * size_t(N) * C);
  for (int e = 0; e < E; ++e)
    for_expert_chunks(offsets, e, s.rows, [&](int r0, int n) {
      gather(s.x, x, row_token + r0, n, C);
      T* ae = a + size_t(r0) * H;
      T* be = b + size_t(r0) * H;
      gemm<T>(false, true, n, H, C, T(1), s.x, C, w1 + e * WH, C, T(0), ae, H);  // a = x W1ᵀ
      gemm<T>(false, true, n, H, C, T(1), s.x, C, w3 + e * WH, C, T(0), be, H);  // b = x W3ᵀ
      swiglu_forward_kernel(s.g, ae, be, size_t(n) * H);
      gemm<T>(false, true, n, C, H, T(1), s.g, H, w2 + e * WH, H, T(0), s.y, C);  // y = g W2ᵀ
      scatter_add_rows(out, s.y, row_token + r0, w_row + r0, n, C);  // combine: out[token] += w y
    });
}

template <typename T>
void expert_mlp_backward_fused(T* dx, T* dw1, T* dw3, T* dw2, T* dw_row, const ExpertChunk<T>& s, const T* dout,
                               const T* x, const int32_t* row_token, const T* w_row, const T* a, const T* b,
                               const T* w1, const T* w3, const T* w2, const int32_t* offsets, int E, int C, int H) {
  const size_t WH = size_t(H) * C;
  for (int e = 0; e < E; ++e)
    for_expert_chunks(offsets, e, s.rows, [&](int r0, int n) {
      const T* ae = a + size_t(r0) * H;
      const T* be = b + size_t(r0) * H;
      gather(s.x, x, row_token + r0, n, C);
      gather(s.dy, dout, row_token + r0, n, C);
      swiglu_forward_kernel(s.g, ae, be, size_t(n) * H);  // recomputed rather than kept
      gemm<T>(false, false, n, H, C, T(1), s.dy, C, w2 + e * WH, H, T(0), s.dg, H);  // dout W2
      // The combine's weight gradient g_r · (dout W2)_r, then the rows' weights into g and dg.
#pragma omp parallel for schedule(static)
      for (int r = 0; r < n; ++r) {
        T* gr = s.g + size_t(r) * H;
        T* dr = s.dg + size_t(r) * H;
        const T w = w_row[r0 + r];
        T acc = 0;
        for (int i = 0; i < H; ++i) acc += gr[i] * dr[i];
        dw_row[r0 + r] = acc;
        for (int i = 0; i < H; ++i) gr[i] *= w, dr[i] *= w;
      }
      gemm<T>(true, false, C, H, n, T(1), s.dy, C, s.g, H, T(1), dw2 + e * WH, H);  // dW2 += doutᵀ (w g)
      T* da = s.g;  // g is dead from here
      swiglu_backward_kernel(da, s.db, s.dg, ae, be, size_t(n) * H);
      gemm<T>(true, false, H, C, n, T(1), da, H, s.x, C, T(1), dw1 + e * WH, C);    // dW1 += daᵀ x
      gemm<T>(true, false, H, C, n, T(1), s.db, H, s.x, C, T(1), dw3 + e * WH, C);  // dW3 += dbᵀ x
      gemm<T>(false, false, n, C, H, T(1), da, H, w1 + e * WH, C, T(0), s.y, C);    // dxe = da W1
      gemm<T>(false, false, n, C, H, T(1), s.db, H, w3 + e * WH, C, T(1), s.y, C);  //     + db W3
      scatter_add_rows<T>(dx, s.y, row_token + r0, nullptr, n, C);  // dispatch backward: dx[token] += dxe
    });
}

#define ATOLL_INSTANTIATE(T)                                                                                       \
  template void expert_mlp_forward_fused<T>(T*, T*, T*, const ExpertChunk<T>&, const T*, const int32_t*, const T*, \
                                            const T*, const T*, const T*, const int32_t*, int, int, int, int);     \
  template void expert_mlp_backward_fused<T>(T*, T*, T*, T*, T*, const ExpertChunk<T>&, const T*, const T*,        \
                                             const int32_t*, const T*, const T*, const T*, const T*, const T*,     \
                                             const T*, const int32_t*, int, int, int);
ATOLL_INSTANTIATE(float)
ATOLL_INSTANTIATE(double)
#undef ATOLL_INSTANTIATE

}  // namespace atl
