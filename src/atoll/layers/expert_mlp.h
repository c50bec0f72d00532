// The experts: SwiGLU MLPs stored as one tensor each with a leading expert dimension,
// Expert_e(x) = W2_e( silu(W1_e x) * (W3_e x) ), run as one matrix product per expert over its
// contiguous block of dispatched rows (offsets from moe_dispatch.h).
#pragma once

#include <cstdint>

namespace atl {

// ye[R,C] (=); a[R,H], b[R,H] (=) the pre-activations W1 x and W3 x, kept for backward;
// g[R,H] (=) scratch holding silu(a) * b. xe[R,C]; w1,w3[E,H,C]; w2[E,C,H]; offsets[E+1].
template <typename T>
void expert_mlp_forward(T* ye, T* a, T* b, T* g, const T* xe, const T* w1, const T* w3, const T* w2,
                        const int32_t* offsets, int E, int C, int H);

// dxe[R,C] (=); dw1, dw3, dw2 (+=). Scratch g, da, db [R,H] (overwritten).
template <typename T>
void expert_mlp_backward(T* dxe, T* dw1, T* dw3, T* dw2, T* g, T* da, T* db, const T* dye, const T* a, const T* b,
                         const T* xe, const T* w1, const T* w3, const T* w2, const int32_t* offsets, int E, int C,
                         int H);

}  // namespace atl
