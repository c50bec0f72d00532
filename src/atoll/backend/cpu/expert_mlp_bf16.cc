#include "atoll/backend/cpu/expert_mlp_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "atoll/backend/cpu/expert_mlp.h"
#include "atoll/backend/cpu/gemm_bf16.h"
#include "atoll/core/vector_math.h"

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

namespace {

// Rows [0, n) from their tokens, rows [n, n_pad) zero.
void gather(bf16* out, const bf16* in, const int32_t* row_token, int n, int n_pad, int C) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n; ++r) std::memcpy(out + size_t(r) * C, in + size_t(row_token[r]) * C, sizeof(bf16) * C);
  std::memset(out + size_t(n) * C, 0, sizeof(bf16) * size_t(n_pad - n) * C);
}

int padded(int n) { return (n + kExpertRowPad - 1) / kExpertRowPad * kExpertRowPad; }

}  // namespace

void expert_mlp_forward_bf16(float* out, bf16* a, const ExpertChunkBf16& s, const bf16* x16,
                             const int32_t* row_token, const float* w_row, const bf16* w1, const bf16* w3,
                             const bf16* w2, const int32_t* offsets, int N, int E, int C, int H) {
  const size_t WH = size_t(H) * C;
  std::memset(out, 0, sizeof(float) * size_t(N) * C);
  for (int e = 0; e < E; ++e)
    for_expert_chunks(offsets, e, s.rows, [&](int r0, int n) {
      const int np = padded(n);  // the pad rows of a, b land on the next chunk's, written after
      gather(s.x, x16, row_token + r0, n, np, C);
      bf16* ae = a + size_t(r0) * H;
      bf16* be = s.db;  // b is not kept: recomputed in backward
      gemm_bf16_out(false, true, np, H, C, 1.0f, s.x, C, w1 + e * WH, C, ae, H);  // a = x W1ᵀ
      gemm_bf16_out(false, true, np, H, C, 1.0f, s.x, C, w3 + e * WH, C, be, H);  // b = x W3ᵀ
      swiglu_forward_bf16(s.g, ae, be, size_t(np) * H);
      gemm_bf16(false, true, np, C, H, 1.0f, s.g, H, w2 + e * WH, H, 0.0f, s.y, C);  // y = g W2ᵀ
      scatter_add_rows(out, s.y, row_token + r0, w_row + r0, n, C);  // combine: out[token] += w y
    });
}

void expert_mlp_backward_bf16(float* dx, float* dw1, float* dw3, float* dw2, float* dw_row, const ExpertChunkBf16& s,
                              const bf16* dout16, const bf16* x16, const int32_t* row_token, const float* w_row,
                              const bf16* a, const bf16* w1, const bf16* w3, const bf16* w2,
                              const int32_t* offsets, int E, int C, int H) {
  const size_t WH = size_t(H) * C;
  for (int e = 0; e < E; ++e)
    for_expert_chunks(offsets, e, s.rows, [&](int r0, int n) {
      const bf16* ae = a + size_t(r0) * H;
      bf16* be = s.db;  // b, recomputed; becomes db in place
      // Pad rows: x and dout zero, so d(gate), da, db are zero there and add nothing to dW.
      const int np = padded(n);
      gather(s.x, x16, row_token + r0, n, np, C);
      gather(s.dy, dout16, row_token + r0, n, np, C);
      gemm_bf16_out(false, true, np, H, C, 1.0f, s.x, C, w3 + e * WH, C, be, H);  // b = x W3ᵀ, as in forward
      swiglu_forward_bf16(s.g, ae, be, size_t(np) * H);  // recomputed rather than kept
      gemm_bf16(false, false, np, H, C, 1.0f, s.dy, C, w2 + e * WH, H, 0.0f, s.dg, H);  // dout W2
      // The combine's weight gradient g_r · (dout W2)_r, then the rows' weights into g and dg.
#pragma omp parallel for schedule(static)
      for (int r = 0; r < n; ++r) {
        bf16* gr = s.g + size_t(r) * H;
        float* dr = s.dg + size_t(r) * H;
        const float w = w_row[r0 + r];
        float acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int i = 0; i < H; ++i) acc += bf16_to_float(gr[i]) * dr[i];
        dw_row[r0 + r] = acc;
        for (int i = 0; i < H; ++i) gr[i] = float_to_bf16(w * bf16_to_float(gr[i])), dr[i] *= w;
      }
      gemm_bf16(true, false, C, H, np, 1.0f, s.dy, C, s.g, H, 1.0f, dw2 + e * WH, H);  // dW2 += doutᵀ (w g)
      bf16* da = s.g;  // g is dead from here
      swiglu_backward_bf16(da, s.db, s.dg, ae, be, size_t(np) * H);
      gemm_bf16(true, false, H, C, np, 1.0f, da, H, s.x, C, 1.0f, dw1 + e * WH, C);    // dW1 += daᵀ x
      gemm_bf16(true, false, H, C, np, 1.0f, s.db, H, s.x, C, 1.0f, dw3 + e * WH, C);  // dW3 += dbᵀ x
      gemm_bf16(false, false, np, C, H, 1.0f, da, H, w1 + e * WH, C, 0.0f, s.y, C);    // dxe = da W1
      gemm_bf16(false, false, np, C, H, 1.0f, s.db, H, w3 + e * WH, C, 1.0f, s.y, C);  //     + db W3
      scatter_add_rows<float>(dx, s.y, row_token + r0, nullptr, n, C);  // dispatch backward: dx[token] += dxe
    });
}

}  // namespace atl
