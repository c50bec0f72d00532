// The experts of layers/expert_mlp.h with bf16 matrix products (gemm_bf16.h): the same
// SwiGLU MLPs Expert_e(x) = W2_e(silu(W1_e x) * (W3_e x)), one product per expert over its
// contiguous block of dispatched rows, inputs and weights in bf16, accumulation and outputs
// in fp32. Only the pre-activation a = W1 x is kept, in bf16: b = W3 x is recomputed in
// backward (one more product per chunk, ~4% of a step, for 134 MB less on the small config;
// this is the memory-lean mode). The SwiGLU gate is computed in fp32 from a and b and
// rounded once to bf16 for the next product.
#pragma once

#include <cstddef>
#include <cstdint>

#include "atoll/backend/cpu/bf16.h"

namespace atl {

// The experts fused with dispatch and combine, one chunk of at most `rows` dispatched rows at
// a time (an expert's rows split evenly), so only the pre-activations a, b [R,H] are ever
// held for all rows (b not even that); the dispatched inputs, the gate, the expert outputs and every gradient
// live in chunk-sized scratch. Rows of one expert belong to distinct tokens, so the scatter
// of a chunk back to its tokens is race-free; contributions arrive in expert order (fixed by
// the routing, so results are reproducible run to run).
// Chunks are rounded up to a multiple of kExpertRowPad rows for the products (pad rows read
// zero inputs), so their shapes come from a small set: the routed row counts change every
// step, and every new shape would cost oneDNN a primitive (time and memory) to build. The
// pre-activation a therefore holds kExpertRowPad rows beyond R, and `rows` must be a
// multiple of kExpertRowPad.
constexpr int kExpertRowPad = 32;

struct ExpertChunkBf16 {
  int rows;         // capacity of the chunk in dispatched rows
  bf16 *x, *dy;     // [rows,C] dispatched inputs, d(block out) at the rows' tokens
  bf16 *g, *db;     // [rows,H] gate (then da); W3 x (then d(W3 x))
  float *y, *dg;    // [rows,C] expert outputs or d(inputs); [rows,H] d(gate)
};

// out[N,C] (=) Σ over rows r of w_row[r] * Expert_e(r)(x16[row_token[r]]); a [R+pad,H] (=) the
// bf16 pre-activation W1 x, kept for backward. x16[N,C] bf16; w1,w3[E,H,C], w2[E,C,H] bf16.
void expert_mlp_forward_bf16(float* out, bf16* a, const ExpertChunkBf16& s, const bf16* x16,
                             const int32_t* row_token, const float* w_row, const bf16* w1, const bf16* w3,
                             const bf16* w2, const int32_t* offsets, int N, int E, int C, int H);

// dx[N,C] (+=) d(input) of every row at its token; dw1, dw3, dw2 (+=) fp32; dw_row[R] (=)
// dout_n · Expert_e(x_n), the combine's weight gradient (see backend/cpu/expert_mlp.h).
// dout16[N,C] d(block out), x16[N,C] the MoE input, both bf16.
void expert_mlp_backward_bf16(float* dx, float* dw1, float* dw3, float* dw2, float* dw_row, const ExpertChunkBf16& s,
                              const bf16* dout16, const bf16* x16, const int32_t* row_token, const float* w_row,
                              const bf16* a, const bf16* w1, const bf16* w3, const bf16* w2,
                              const int32_t* offsets, int E, int C, int H);

// The SwiGLU gate on bf16 pre-activations, as layers/swiglu.h computes it in fp32.
// g[n] (=) bf16(silu(a) * b).
void swiglu_forward_bf16(bf16* g, const bf16* a, const bf16* b, size_t n);
// da[n], db[n] (=) bf16 of dg * b * silu'(a) and dg * silu(a). db may alias b.
void swiglu_backward_bf16(bf16* da, bf16* db, const float* dg, const bf16* a, const bf16* b, size_t n);

}  // namespace atl
