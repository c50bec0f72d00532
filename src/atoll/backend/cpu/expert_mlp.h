// The experts of layers/expert_mlp.h fused with dispatch and combine (layers/moe_dispatch.h),
// one chunk of at most `rows` dispatched rows at a time (an expert's rows split evenly): only
// the pre-activations a, b [R,H] are held for all rows; dispatched inputs, gate, expert
// outputs and all gradients live in chunk-sized scratch, and the expert outputs ye are never
// kept. Rows of one expert belong to distinct tokens, so a chunk's scatter back to its tokens
// is race-free; contributions arrive in expert order (fixed by the routing: reproducible).
//
// The combine's weight gradient without ye: with out[n] = Σ_j w[n,j] ye_r, ye_r = W2 g_r and
// g = silu(a) * b, d w = dout_n · ye_r = (dout_n W2) · g_r, a row dot product of the
// un-weighted d(gate) with the recomputed gate, both at hand inside the backward. The rows
// then carry their weight into g_r and dg_r, which gives exactly the gradients of
// layers/expert_mlp.h with dye_r = w_r dout_n (the same sums, regrouped).
#pragma once

#include <cstddef>
#include <cstdint>

namespace atl {

// dst[row_token[r]] += w[r] * rows[r] for r < n (w null: weight 1): the combine, and the
// dispatch backward. Rows of one chunk belong to distinct tokens, so the loop is race-free.
template <typename T>
inline void scatter_add_rows(T* dst, const T* rows, const int32_t* row_token, const T* w, int n, int C) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < n; ++r) {
    T* d = dst + size_t(row_token[r]) * C;
    const T* y = rows + size_t(r) * C;
    const T wr = w ? w[r] : T(1);
    for (int c = 0; c < C; ++c) d[c] += wr * y[c];
  }
}

template <typename T>
struct ExpertChunk {
  int rows;       // capacity in dispatched rows
  T *x, *dy, *y;  // [rows,C] dispatched inputs, d(block out) at the rows' tokens, outputs / d(inputs)
  T *g, *dg, *db; // [rows,H] gate (then da), d(gate), d(W3 x)
  static size_t elements(int rows, int C, int H) { return size_t(rows) * (3 * size_t(C) + 3 * size_t(H)); }
  // Carves the chunk out of `buf` of elements(rows, C, H).
  static ExpertChunk carve(T* buf, int rows, int C, int H) {
    const size_t rc = size_t(rows) * C, rh = size_t(rows) * H;
    return {rows, buf, buf + rc, buf + 2 * rc, buf + 3 * rc, buf + 3 * rc + rh, buf + 3 * rc + 2 * rh};
  }
};

// out[N,C] (=) Σ over rows r of w_row[r] * Expert_e(r)(x[row_token[r]]); a, b [R,H] (=) the
// pre-activations W1 x and W3 x, kept for backward. x[N,C]; w1,w3[E,H,C]; w2[E,C,H].
template <typename T>
void expert_mlp_forward_fused(T* out, T* a, T* b, const ExpertChunk<T>& s, const T* x, const int32_t* row_token,
                              const T* w_row, const T* w1, const T* w3, const T* w2, const int32_t* offsets, int N,
                              int E, int C, int H);

// dx[N,C] (+=) d(input) of every row at its token; dw1, dw3, dw2 (+=); dw_row[R] (=)
// dout_n · ye_r. dout[N,C] d(block out); x[N,C] the MoE input as in forward.
template <typename T>
void expert_mlp_backward_fused(T* dx, T* dw1, T* dw3, T* dw2, T* dw_row, const ExpertChunk<T>& s, const T* dout,
                               const T* x, const int32_t* row_token, const T* w_row, const T* a, const T* b,
                               const T* w1, const T* w3, const T* w2, const int32_t* offsets, int E, int C, int H);

// Calls f(r0, n) for the chunks of expert e's rows: at most `cap` rows each, split evenly.
template <typename F>
void for_expert_chunks(const int32_t* offsets, int e, int cap, F&& f) {
  const int begin = offsets[e], n = offsets[e + 1] - begin;
  if (n == 0) return;
  const int pieces = (n + cap - 1) / cap, size = (n + pieces - 1) / pieces;
  for (int r = 0; r < n; r += size) f(begin + r, n - r < size ? n - r : size);
}

}  // namespace atl
