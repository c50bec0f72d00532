// Causal attention as blocked matrix products: the fast path behind layers/attention.h, with
// the same signatures and semantics (tests/backend/attention_test.cc compares the two).
// Queries go in blocks of kBlock rows; a block attends only to keys up to its last row, so
// the masked upper triangle is skipped except on the diagonal blocks (about half the work of
// the full T×T matrix). Scores live only in a per-thread [kBlock, T] tile; the backward pass
// recomputes them from the saved log-sum-exp.
#pragma once

namespace atl {

// As attention_forward: out[B,T,NH,HD] (=), lse[B,NH,T] (=).
template <typename T>
void attention_forward_blocked(T* out, T* lse, const T* q, const T* k, const T* v, int B, int T_, int NH, int NKV,
                               int HD);

// As attention_backward: dq[B,T,NH,HD], dk/dv[B,T,NKV,HD] (all =).
template <typename T>
void attention_backward_blocked(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                                const T* k, const T* v, int B, int T_, int NH, int NKV, int HD);

}  // namespace atl
