// Causal multi-head attention with grouped-query heads (NKV key/value heads, each shared by
// NH/NKV query heads), scale 1/sqrt(HD). The T×T probability matrix is never stored: the
// forward keeps only the log-sum-exp of each row and the backward recomputes the
// probabilities from it (the FlashAttention recipe, here in plain loops).
#pragma once

namespace atl {

// out[B,T,NH,HD] (=), lse[B,NH,T] (=) log-sum-exp of each row of scaled scores.
// q[B,T,NH,HD], k[B,T,NKV,HD], v[B,T,NKV,HD] (after RoPE).
template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, int B, int T_, int NH, int NKV, int HD);

// dq[B,T,NH,HD], dk/dv[B,T,NKV,HD] (all =). With P recomputed from lse and
// D_t = dout_t · out_t: dS = P ∘ (dout·vᵀ − D), dq = dS·k·scale, dk = dSᵀ·q·scale, dv = Pᵀ·dout.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                        const T* v, int B, int T_, int NH, int NKV, int HD);

}  // namespace atl
