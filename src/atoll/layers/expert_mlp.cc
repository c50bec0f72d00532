#include "atoll/layers/expert_mlp.h"

#include <cstddef>

#include "atoll/layers/blas.h"
#include "atoll/layers/swiglu.h"

namespace atl {

template <typename T>
void expert_mlp_forward(T* ye, T* a, T* b, T* g, const T* xe, const T* w1, const T* w3, const T* w2,
                        const int32_t* offsets, int E, int C, int H) {
  const size_t WH = size_t(H) * C;  // elements of one expert matrix
  for (int e = 0; e < E; ++e) {
    const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    const T* x = xe + size_t(r0) * C;
    blas_gemm<T>(false, true, n, H, C, T(1), x, C, w1 + e * WH, C, T(0), a + size_t(r0) * H, H);  // a = x W1ᵀ
    blas_gemm<T>(false, true, n, H, C, T(1), x, C, w3 + e * WH, C, T(0), b + size_t(r0) * H, H);  // b = x W3ᵀ
  }
  const size_t RH = size_t(offsets[E]) * H;
  swiglu_forward(g, a, b, RH);
  for (int e = 0; e < E; ++e) {
    const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    blas_gemm<T>(false, true, n, C, H, T(1), g + size_t(r0) * H, H, w2 + e * WH, H, T(0), ye + size_t(r0) * C, C);
  }
}

template <typename T>
void expert_mlp_backward(T* dxe, T* dw1, T* dw3, T* dw2, T* g, T* da, T* db, const T* dye, const T* a, const T* b,
                         const T* xe, const T* w1, const T* w3, const T* w2, const int32_t* offsets, int E, int C,
                         int H) {
  const size_t WH = size_t(H) * C;
  const size_t RH = size_t(offsets[E]) * H;
  swiglu_forward(g, a, b, RH);  // recomputed rather than kept: saves R*H per layer
  for (int e = 0; e < E; ++e) {
    const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    const T* dy = dye + size_t(r0) * C;
    blas_gemm<T>(true, false, C, H, n, T(1), dy, C, g + size_t(r0) * H, H, T(1), dw2 + e * WH, H);    // dW2 += dyᵀ g
    blas_gemm<T>(false, false, n, H, C, T(1), dy, C, w2 + e * WH, H, T(0), da + size_t(r0) * H, H);  // dg = dy W2
  }
  swiglu_backward(da, db, da, a, b, RH);
  for (int e = 0; e < E; ++e) {
    const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
    T* dx = dxe + size_t(r0) * C;
    if (n == 0) continue;
    const T* x = xe + size_t(r0) * C;
    const T* dae = da + size_t(r0) * H;
    const T* dbe = db + size_t(r0) * H;
    blas_gemm<T>(true, false, H, C, n, T(1), dae, H, x, C, T(1), dw1 + e * WH, C);    // dW1 += daᵀ x
    blas_gemm<T>(true, false, H, C, n, T(1), dbe, H, x, C, T(1), dw3 + e * WH, C);    // dW3 += dbᵀ x
    blas_gemm<T>(false, false, n, C, H, T(1), dae, H, w1 + e * WH, C, T(0), dx, C);   // dx = da W1
    blas_gemm<T>(false, false, n, C, H, T(1), dbe, H, w3 + e * WH, C, T(1), dx, C);   //    + db W3
  }
}

template void expert_mlp_forward<float>(float*, float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const int32_t*, int, int, int);
template void expert_mlp_forward<double>(double*, double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const int32_t*, int, int, int);
template void expert_mlp_backward<float>(float*, float*, float*, float*, float*, float*, float*, const float*,
                                         const float*, const float*, const float*, const float*, const float*,
                                         const float*, const int32_t*, int, int, int);
template void expert_mlp_backward<double>(double*, double*, double*, double*, double*, double*, double*,
                                          const double*, const double*, const double*, const double*, const double*,
                                          const double*, const double*, const int32_t*, int, int, int);

}  // namespace atl
