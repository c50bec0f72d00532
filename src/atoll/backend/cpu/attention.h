// Causal attention as blocked matrix products: the fast path behind layers/attention.h, with
// the same signatures and semantics (tests/backend/attention_test.cc compares the two).
// Queries go in blocks of kBlock rows; a block attends only to keys up to its last row, so
// the masked upper triangle is skipped except on the diagonal blocks (about half the work of
// the full T×T matrix). Scores live only in a per-thread [kBlock, T] tile; the backward pass
// recomputes them from the saved log-sum-exp.
#pragma once

#include "atoll/backend/cpu/bf16.h"

namespace atl {

// As attention_forward: out[B,T,NH,HD] (=), lse[B,NH,T] (=).
template <typename T>
void attention_forward_blocked(T* out, T* lse, const T* q, const T* k, const T* v, int B, int T_, int NH, int NKV,
                               int HD);

// As attention_backward: dq[B,T,NH,HD], dk/dv[B,T,NKV,HD] (all =).
template <typename T>
void attention_backward_blocked(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                                const T* k, const T* v, int B, int T_, int NH, int NKV, int HD);

// The same with bf16 products (gemm_bf16.h), for train.precision = bf16: q, k, v and the
// output are held in bf16 (what the surrounding bf16 products consume anyway, and half the
// memory kept per layer); scores, softmax, log-sum-exp and the gradients stay fp32, and the
// probabilities and their gradients are rounded to bf16 only as inputs of the tile products.
// out[B,T,NH,HD] (=) bf16, lse[B,NH,T] (=).
void attention_forward_blocked_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T_,
                                    int NH, int NKV, int HD);

// dq[B,T,NH,HD], dk/dv[B,T,NKV,HD] (all =) fp32; dout bf16.
void attention_backward_blocked_bf16(float* dq, float* dk, float* dv, const bf16* dout, const bf16* out,
                                     const float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T_,
                                     int NH, int NKV, int HD);

}  // namespace atl
