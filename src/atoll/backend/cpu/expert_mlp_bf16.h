// The experts of layers/expert_mlp.h with bf16 matrix products (gemm_bf16.h): the same
// SwiGLU MLPs Expert_e(x) = W2_e(silu(W1_e x) * (W3_e x)), one product per expert over its
// contiguous block of dispatched rows, inputs and weights in bf16, accumulation and outputs
// in fp32. The pre-activations a, b are kept in bf16 (what PyTorch autocast keeps), which
// halves the largest activation of the model; the SwiGLU gate is computed in fp32 from them
// and rounded once to bf16 for the next product.
#pragma once

#include <cstdint>

#include "atoll/backend/cpu/bf16.h"

namespace atl {

// ye[R,C] (=) fp32; a[R,H], b[R,H] (=) bf16 pre-activations W1 x and W3 x, kept for backward;
// g[R,H] (=) bf16 scratch holding silu(a) * b. xe[R,C] bf16; w1,w3[E,H,C], w2[E,C,H] bf16.
void expert_mlp_forward_bf16(float* ye, bf16* a, bf16* b, bf16* g, const bf16* xe, const bf16* w1, const bf16* w3,
                             const bf16* w2, const int32_t* offsets, int E, int C, int H);

// dxe[R,C] (=) fp32; dw1, dw3, dw2 (+=) fp32. dye[R,C] bf16. Scratch (overwritten): g, da, db
// [R,H] bf16 and dg[R,H] fp32.
void expert_mlp_backward_bf16(float* dxe, float* dw1, float* dw3, float* dw2, bf16* g, float* dg, bf16* da,
                              bf16* db, const bf16* dye, const bf16* a, const bf16* b, const bf16* xe,
                              const bf16* w1, const bf16* w3, const bf16* w2, const int32_t* offsets, int E, int C,
                              int H);

// The SwiGLU gate on bf16 pre-activations, as layers/swiglu.h computes it in fp32.
// g[n] (=) bf16(silu(a) * b).
void swiglu_forward_bf16(bf16* g, const bf16* a, const bf16* b, size_t n);
// da[n], db[n] (=) bf16 of dg * b * silu'(a) and dg * silu(a).
void swiglu_backward_bf16(bf16* da, bf16* db, const float* dg, const bf16* a, const bf16* b, size_t n);

}  // namespace atl
