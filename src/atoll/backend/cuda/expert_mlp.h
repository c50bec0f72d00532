// The MoE experts on the device, with dispatch and combine: semantics of layers/expert_mlp.h
// and layers/moe_dispatch.h (SwiGLU experts w2(silu(w1 x) * w3 x), rows grouped by expert in
// the routing's order), as in Model<float>, which runs backend/cpu/expert_mlp.h's fused form of
// the same sums.
//
// Each expert's rows are one contiguous block of the routing, so its three products are plain
// GEMMs on a row range; the ranges come from a host copy of the routing offsets (the caller
// copies offsets [E+1] to the host once per layer, in forward, and keeps it for backward).
// Experts with no rows are skipped. Weights: w1, w3 [E,H,C]; w2 [E,C,H]. Device pointers except
// `offsets`.
//
// `dtype` = kBF16 (train.precision = bf16): the weights are bf16 bits (the rounded copy of the
// parameters) and every product's activation input is rounded to bf16 first, into the
// scratch's bf16 buffers; accumulation, outputs, the SwiGLU and all gradients stay fp32.
#pragma once

#include <cstdint>

#include "atoll/backend/cuda/blas.h"
#include "atoll/backend/cuda/moe_dispatch.h"

namespace atl::gpu {

// Scratch of one layer's experts over R = N*K rows.
struct ExpertScratch {
  float *xe, *ye, *dye;  // [R,C] dispatched inputs; expert outputs, then d(inputs); d(outputs)
  float *g, *dg, *db;    // [R,H] gate; d(gate), then d(W1 x); d(W3 x)
  // kBF16 only (null otherwise): bf16 copies of the products' inputs.
  uint16_t *xe16, *dye16;        // [R,C] dispatched inputs; d(outputs)
  uint16_t *g16, *da16, *db16;   // [R,H] gate; d(W1 x); d(W3 x)
};

// out[N,C] (=) Σ_j topk_w[n,j] * Expert_e(x[n]); a, b [R,H] (=) W1 x, W3 x of each row, kept
// for backward. x[N,C].
void expert_mlp_forward(Blas& blas, float* out, float* a, float* b, const ExpertScratch& s, const float* x,
                        const DeviceRouting& routing, const int32_t* offsets, const float* topk_w, const void* w1,
                        const void* w3, const void* w2, int N, int E, int C, int H, int K, Dtype dtype = Dtype::kF32);

// dx[N,C] (+=) d(x); dw1, dw3, dw2 (+=); dtopk_w[N,K] (=) dout_n · ye_r. dout[N,C] d(out); x, a, b
// as in forward. The expert outputs ye are recomputed (one more product) rather than kept.
void expert_mlp_backward(Blas& blas, float* dx, float* dw1, float* dw3, float* dw2, float* dtopk_w,
                         const ExpertScratch& s, const float* dout, const float* x, const DeviceRouting& routing,
                         const int32_t* offsets, const float* topk_w, const float* a, const float* b, const void* w1,
                         const void* w3, const void* w2, int N, int E, int C, int H, int K,
                         Dtype dtype = Dtype::kF32);

}  // namespace atl::gpu
