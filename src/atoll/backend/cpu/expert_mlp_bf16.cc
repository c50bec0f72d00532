#include "atoll/backend/cpu/expert_mlp_bf16.h"

#include <cmath>
#include <cstddef>

#include "atoll/backend/cpu/gemm_bf16.h"

namespace atl {

void swiglu_forward_bf16(bf16* g, const bf16* a, const bf16* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float x = bf16_to_float(a[i]);
    const float s = 1.0f / (1.0f + std::exp(-x));
    g[i] = float_to_bf16(x * s * bf16_to_float(b[i]));
  }
}

void swiglu_backward_bf16(bf16* da, bf16* db, const float* dg, const bf16* a, const bf16* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float x = bf16_to_float(a[i]), y = bf16_to_float(b[i]), d = dg[i];
    const float s = 1.0f / (1.0f + std::exp(-x));
    db[i] = float_to_bf16(d * x * s);
    da[i] = float_to_bf16(d * y * s * (1.0f + x * (1.0f - s)));
  }
}

void expert_mlp_forward_bf16(float* ye, bf16* a, bf16* b, bf16* g, const bf16* xe, const bf16* w1, const bf16* w3,
                             const bf16* w2, const int32_t* offsets, int E, int C, int H) {
  const size_t WH = size_t(H) * C;
  for (int e = 0; e < E; ++e) {
    const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    const bf16* x = xe + size_t(r0) * C;
    gemm_bf16_out(false, true, n, H, C, 1.0f, x, C, w1 + e * WH, C, a + size_t(r0) * H, H);  // a = x W1ᵀ
    gemm_bf16_out(false, true, n, H, C, 1.0f, x, C, w3 + e * WH, C, b + size_t(r0) * H, H);  // b = x W3ᵀ
  }
  swiglu_forward_bf16(g, a, b, size_t(offsets[E]) * H);
  for (int e = 0; e < E; ++e) {
    const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    gemm_bf16(false, true, n, C, H, 1.0f, g + size_t(r0) * H, H, w2 + e * WH, H, 0.0f, ye + size_t(r0) * C, C);
  }
}

void expert_mlp_backward_bf16(float* dxe, float* dw1, float* dw3, float* dw2, bf16* g, float* dg, bf16* da,
                              bf16* db, const bf16* dye, const bf16* a, const bf16* b, const bf16* xe,
                              const bf16* w1, const bf16* w3, const bf16* w2, const int32_t* offsets, int E, int C,
                              int H) {
  const size_t WH = size_t(H) * C, RH = size_t(offsets[E]) * H;
  swiglu_forward_bf16(g, a, b, RH);  // recomputed rather than kept
  for (int e = 0; e < E; ++e) {
    const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    const bf16* dy = dye + size_t(r0) * C;
    gemm_bf16(true, false, C, H, n, 1.0f, dy, C, g + size_t(r0) * H, H, 1.0f, dw2 + e * WH, H);    // dW2 += dyᵀ g
    gemm_bf16(false, false, n, H, C, 1.0f, dy, C, w2 + e * WH, H, 0.0f, dg + size_t(r0) * H, H);  // dg = dy W2
  }
  swiglu_backward_bf16(da, db, dg, a, b, RH);
  for (int e = 0; e < E; ++e) {
    const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    const bf16* x = xe + size_t(r0) * C;
    const bf16* dae = da + size_t(r0) * H;
    const bf16* dbe = db + size_t(r0) * H;
    float* dx = dxe + size_t(r0) * C;
    gemm_bf16(true, false, H, C, n, 1.0f, dae, H, x, C, 1.0f, dw1 + e * WH, C);   // dW1 += daᵀ x
    gemm_bf16(true, false, H, C, n, 1.0f, dbe, H, x, C, 1.0f, dw3 + e * WH, C);   // dW3 += dbᵀ x
    gemm_bf16(false, false, n, C, H, 1.0f, dae, H, w1 + e * WH, C, 0.0f, dx, C);  // dx = da W1
    gemm_bf16(false, false, n, C, H, 1.0f, dbe, H, w3 + e * WH, C, 1.0f, dx, C);  //    + db W3
  }
}

}  // namespace atl
