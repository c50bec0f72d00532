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
#pragma once

#include <cstdint>

#include "atoll/backend/cuda/blas.h"
#include "atoll/backend/cuda/moe_dispatch.h"

namespace atl::gpu {

// Scratch of one layer's experts over R = N*K rows.
struct ExpertScratch {
  float *xe, *ye, *dye;  // [R,C] dispatched inputs; expert outputs, then d(inputs); d(outputs)
  float *g, *dg, *db;    // [R,H] gate; d(gate), then d(W1 x); d(W3 x)
};

// out[N,C] (=) Σ_j topk_w[n,j] * Expert_e(x[n]); a, b [R,H] (=) W1 x, W3 x of each row, kept
// for backward. x[N,C].
void expert_mlp_forward(Blas& blas, float* out, float* a, float* b, const ExpertScratch& s, const float* x,
                        const DeviceRouting& routing, const int32_t* offsets, const float* topk_w, const float* w1,
                        const float* w3, const float* w2, int N, int E, int C, int H, int K);

// dx[N,C] (+=) d(x); dw1, dw3, dw2 (+=); dtopk_w[N,K] (=) dout_n · ye_r. dout[N,C] d(out); x, a, b
// as in forward. The expert outputs ye are recomputed (one more product) rather than kept.
void expert_mlp_backward(Blas& blas, float* dx, float* dw1, float* dw3, float* dw2, float* dtopk_w,
                         const ExpertScratch& s, const float* dout, const float* x, const DeviceRouting& routing,
                         const int32_t* offsets, const float* topk_w, const float* a, const float* b, const float* w1,
                         const float* w3, const float* w2, int N, int E, int C, int H, int K);

}  // namespace atl::gpu
