// Compressed convolutional attention (CCA; Figliolia et al. 2025, "Compressed Convolutional
// Attention", arXiv 2510.04476), as ZAYA1 uses it and as Hugging Face transformers' `zaya`
// model computes it (ZayaCCAProjection, ZayaQKNorm, ZayaAttention):
//
//   qp = h wqᵀ [N,QD], kp = h wkᵀ [N,KVD]            QD = NH·HD, KVD = NKV·HD (the compressed space)
//   x  = [qp | kp] [N,CC], CC = QD + KVD
//   y  = depthwise causal conv of x, kernel t0, bias b0     (w0 [CC,1,t0])
//   z  = grouped causal conv of y, kernel t1, bias b1, one group of HD channels per head (w1 [CC,HD,t1])
//   mq[hq] = (qp[hq] + kp[hq/G]) / 2, mk[hk] = mean over its G query heads of mq   (G = NH/NKV)
//   q  = z[:, :QD] + mq,  k = z[:, QD:] + mk                  (the qk-mean skip)
//   v  = [h wvcᵀ | shift(h wvdᵀ)] [N,KVD], split into NKV heads of HD: the current token's half,
//        then the previous token's (0 at t = 0); with NKV = 2, head 0 is all current token
//   q̂  = q · √HD / ‖q‖,  k̂ = k · √HD / ‖k‖ · temp[hk]          (per head; ‖·‖ clamped at kNormEps)
//   out = wo · attention(rope(q̂), rope(k̂), v)                  causal GQA, scale 1/√HD, partial RoPE
//
// Causal padding, as upstream pads [q|k] with t0 - 1 + t1 - 1 zeros on the left before both
// convolutions: y exists for times -(t1-1) .. T-1, and for negative times it is exactly b0
// (the first convolution sees only zeros), so the second convolution sees the first one's bias
// at t < 0, not zero. Each sequence of the batch is padded on its own.
//
// The pieces are separate _forward/_backward pairs so that model/attention_cca runs them
// around its fast products; cca_forward/cca_backward compose them with the plain linear, RoPE
// and attention references into the whole layer (the oracle of the tests).
#pragma once

#include "atoll/layers/rope.h"

namespace atl {

// The sizes of one CCA layer (legend in layers/README.md); t0, t1 the two kernels.
struct CcaDims {
  int B, T, C, NH, NKV, HD, t0, t1;
  int QD() const { return NH * HD; }
  int KVD() const { return NKV * HD; }
  int CC() const { return (NH + NKV) * HD; }
  int N() const { return B * T; }
  int TY() const { return T + t1 - 1; }  // times of y per sequence: -(t1-1) .. T-1
};

// The clamp of the q and k norms: torch.finfo(float32).eps, as transformers clamps (in double
// too, so both precisions compute the same function).
inline constexpr double kCcaNormEps = 1.1920928955078125e-07;

// y[B,TY,CC] (=), z[B,T,CC] (=) from x[B,T,CC]; w0[CC,t0], b0[CC], w1[CC,HD,t1], b1[CC].
template <typename T>
void cca_conv_forward(T* z, T* y, const T* x, const T* w0, const T* b0, const T* w1, const T* b1, const CcaDims& d);

// dx[B,T,CC] (+=), dw0, db0, dw1, db1 (+=) from dz[B,T,CC]; dy[B,TY,CC] is scratch (=).
template <typename T>
void cca_conv_backward(T* dx, T* dw0, T* db0, T* dw1, T* db1, T* dy, const T* dz, const T* y, const T* x,
                       const T* w0, const T* w1, const CcaDims& d);

// q[N,QD] (=) z[:, :QD] + mq, k[N,KVD] (=) z[:, QD:] + mk, from z[N,CC] and x = [qp|kp] [N,CC].
template <typename T>
void cca_qk_mean_forward(T* q, T* k, const T* z, const T* x, const CcaDims& d);

// dz[N,CC] (=) [dq | dk]; dx[N,CC] (+=) the mean terms' share, from dq[N,QD], dk[N,KVD].
template <typename T>
void cca_qk_mean_backward(T* dz, T* dx, const T* dq, const T* dk, const CcaDims& d);

// qn[N,QD], kn[N,KVD] (=) the normalised q and k (k times temp[NKV]); rq[N,NH], rk[N,NKV] (=)
// 1 / max(‖·‖, kCcaNormEps) of each head. qn, kn may not alias q, k.
template <typename T>
void cca_qk_norm_forward(T* qn, T* kn, T* rq, T* rk, const T* q, const T* k, const T* temp, const CcaDims& d);

// dq[N,QD], dk[N,KVD] (=) and dtemp[NKV] (+=) from dqn, dkn; q, k, rq, rk, temp as in forward.
// The clamp's own branch (a head of norm below kCcaNormEps) is not differentiated.
template <typename T>
void cca_qk_norm_backward(T* dq, T* dk, T* dtemp, const T* dqn, const T* dkn, const T* q, const T* k, const T* rq,
                          const T* rk, const T* temp, const CcaDims& d);

// v[N,KVD] (=) per token [vc | vd of the previous token (0 at t = 0)]; vc, vd [N,KVD/2].
template <typename T>
void cca_value_forward(T* v, const T* vc, const T* vd, const CcaDims& d);

// dvc, dvd [N,KVD/2] (=) from dv[N,KVD].
template <typename T>
void cca_value_backward(T* dvc, T* dvd, const T* dv, const CcaDims& d);

// The whole layer's parameters, in upstream's shapes (rows [out, in]).
template <typename T>
struct CcaWeights {
  const T *wq, *wk, *wvc, *wvd;  // [QD,C], [KVD,C], [KVD/2,C] x2
  const T *w0, *b0, *w1, *b1;    // [CC,1,t0], [CC], [CC,HD,t1], [CC]
  const T* temp;                 // [NKV]
  const T* wo;                   // [C,QD]
};
template <typename T>
struct CcaGrads {
  T *wq, *wk, *wvc, *wvd, *w0, *b0, *w1, *b1, *temp, *wo;
};

// out[N,C] (=) the layer on h[N,C]; rope a table of at least T positions with its rotary dim.
template <typename T>
void cca_forward(T* out, const T* h, const CcaWeights<T>& w, const RopeTable<T>& rope, const CcaDims& d);

// dh[N,C] (+=) and every gradient in g (+=) from dout[N,C]; recomputes the forward.
template <typename T>
void cca_backward(T* dh, const CcaGrads<T>& g, const T* dout, const T* h, const CcaWeights<T>& w,
                  const RopeTable<T>& rope, const CcaDims& d);

}  // namespace atl
