// What the attention parts (attention_gqa, attention_cca) share: their scratch (the RoPE table
// and the bf16 product buffers, one for every attention layer of either kind), and once their
// q, k, v exist, the blocked causal attention kernels (backend/cpu/attention.h) in the
// precision q, k, v are kept in, and decoding's one query row against the cached keys and values.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <type_traits>
#include <vector>

#include "atoll/backend/cpu/attention.h"
#include "atoll/core/check.h"
#include "atoll/layers/rope.h"
#include "atoll/model/part.h"
#include "atoll/model/ring_attention.h"

namespace atl {

// Shared by the attention layers (PartScratch): the RoPE tables (model.rope_theta's, and
// model.rope_theta_local's when a layer is local) and the products' bf16 buffers.
template <typename T>
struct AttentionScratch {
  AttentionScratch(const ModelConfig& m, const PartSizes& s) : m_(m) {
    build_ropes(m.seq_len);
    if (s.precision != Precision::kBf16) return;
    const size_t N = s.max_tokens, QD = size_t(m.n_heads) * m.head_dim, KVD = size_t(m.n_kv_heads) * m.head_dim;
    in16.resize(N * m.dim), dout16.resize(N * std::max({size_t(m.dim), QD, KVD}));
  }
  // Decoding: a table for max_len positions.
  void grow_rope(int max_len) {
    if (rope.seq_len < max_len) build_ropes(max_len);
  }
  // The table of a layer's RoPE base (model.rope_layers).
  const RopeTable<T>& rope_of(int layer) const { return m_.rope_local_at(layer) ? rope_local : rope; }
  RopeTable<T> rope, rope_local;   // [max(T, decoding length), RD/2]; rope_local empty without local layers
  std::vector<bf16> in16, dout16;  // a product's bf16 input [N,C] and output gradient [N, max(C,QD,KVD)]

 private:
  void build_ropes(int len) {
    rope = RopeTable<T>::build(len, m_.head_dim, m_.rope_theta, m_.rotary_dim());
    if (m_.any_rope_local()) rope_local = RopeTable<T>::build(len, m_.head_dim, m_.rope_theta_local, m_.rotary_dim());
  }
  ModelConfig m_;
};

// x[B,T,NHX,HD] rotated in place by RoPE at the tokens' positions (forward), or by its inverse
// (backward, the same positions): each run of each sequence at its own start.
template <typename T>
void rope_at(T* x, const RopeTable<T>& table, int B, int T_, int NHX, int HD, const TokenPositions& pos,
             bool backward) {
  if (pos.runs == 1) {
    if (backward) return rope_backward(x, table, B, T_, NHX, HD, pos.start[0]);
    return rope_forward(x, table, B, T_, NHX, HD, pos.start[0]);
  }
  ATOLL_CHECK(pos.runs <= TokenPositions::kMaxRuns && pos.len[0] + pos.len[1] == T_)
      << pos.runs << " runs of " << pos.len[0] << " + " << pos.len[1] << " tokens for T=" << T_;
  for (int b = 0; b < B; ++b)
    for (int r = 0, at = 0; r < pos.runs; at += pos.len[r++]) {
      T* run = x + (size_t(b) * T_ + size_t(at)) * NHX * HD;
      if (backward) rope_backward(run, table, 1, pos.len[r], NHX, HD, pos.start[r]);
      else rope_forward(run, table, 1, pos.len[r], NHX, HD, pos.start[r]);
    }
}

// out[B,T,NH,HD] (=), lse[B,NH,T] (=): causal GQA, scale 1/sqrt(HD), in bf16 when q, k, v are kept so;
// over the context-parallel group's ring when the call holds chunks (PartContext::cp, fp32).
template <typename T>
void attention_any(Kept<T>& out, T* lse, const Kept<T>& q, const Kept<T>& k, const Kept<T>& v, int B, int T_, int NH,
                   int NKV, int HD, const PartContext<T>& c) {
  if (c.cp) {
    ATOLL_CHECK(out.h.empty()) << "context parallelism runs fp32 attention";
    return ring_attention_forward(out.f.data(), lse, q.f.data(), k.f.data(), v.f.data(), RingDims{B, NH, NKV, HD},
                                  *c.zigzag, *c.cp);
  }
  if constexpr (kHasBf16<T>)
    if (!out.h.empty())
      return attention_forward_blocked_bf16(out.h.data(), lse, q.h.data(), k.h.data(), v.h.data(), B, T_, NH, NKV, HD);
  attention_forward_blocked(out.f.data(), lse, q.f.data(), k.f.data(), v.f.data(), B, T_, NH, NKV, HD);
}

// dq[B,T,NH,HD], dk, dv[B,T,NKV,HD] (=) from dout, as attention_any kept them. `dq_ready` (if
// given) runs once dq is final, before dk and dv are written when the ring's last transfer can
// hide behind it (ring_attention_backward), after the whole backward otherwise: it may read and
// use dq only.
template <typename T>
void attention_any_backward(T* dq, T* dk, T* dv, Operand<T> dout, const Kept<T>& out, const T* lse, const Kept<T>& q,
                            const Kept<T>& k, const Kept<T>& v, int B, int T_, int NH, int NKV, int HD,
                            const PartContext<T>& c, const std::function<void()>& dq_ready = {}) {
  if (c.cp)
    return ring_attention_backward(dq, dk, dv, dout.f, out.f.data(), lse, q.f.data(), k.f.data(), v.f.data(),
                                   RingDims{B, NH, NKV, HD}, *c.zigzag, *c.cp, dq_ready);
  [&] {
    if constexpr (kHasBf16<T>)
      if (!out.h.empty())
        return attention_backward_blocked_bf16(dq, dk, dv, dout.h, out.h.data(), lse, q.h.data(), k.h.data(),
                                               v.h.data(), B, T_, NH, NKV, HD);
    attention_backward_blocked(dq, dk, dv, dout.f, out.f.data(), lse, q.f.data(), k.f.data(), v.f.data(), B, T_, NH,
                               NKV, HD);
  }();
  if (dq_ready) dq_ready();
}

// Tree attention (decoding over the P ranks of PartContext::cp; Zyphra, arXiv 2408.04093): the
// key and value of position t live on rank t mod P, at row t / P of its cache, so the shards
// grow evenly. Every rank computes every token's q, k, v and the position-wise rest (the
// weights are replicated); only the cache and the attention over it are divided.
struct CacheShard {
  int P = 1, r = 0;
  template <typename T>
  static CacheShard of(const PartContext<T>& c) {
    return c.cp ? CacheShard{c.cp->size(), c.cp->rank()} : CacheShard{};
  }
  bool holds(int pos) const { return pos % P == r; }
  int row(int pos) const { return pos / P; }
  int rows(int len) const { return len > r ? (len - 1 - r) / P + 1 : 0; }  // of positions [0, len)
};

}  // namespace atl
