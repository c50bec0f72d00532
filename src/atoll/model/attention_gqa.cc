#include "atoll/model/attention_gqa.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "atoll/backend/cpu/attention.h"
#include "atoll/core/check.h"

namespace atl {

void attention_gqa_rows(ParamLayout& layout, const ModelConfig& m, int layer) {
  const std::string pre = layer_prefix(layer) + "attn.";
  const int64_t C = m.dim, QD = int64_t(m.n_heads) * m.head_dim, KVD = int64_t(m.n_kv_heads) * m.head_dim;
  layout.add(matrix_entry(pre + "wq", QD, C, ParamGroup::kAttention, layer));
  layout.add(matrix_entry(pre + "wk", KVD, C, ParamGroup::kAttention, layer));
  layout.add(matrix_entry(pre + "wv", KVD, C, ParamGroup::kAttention, layer));
  layout.add(matrix_entry(pre + "wo", C, QD, ParamGroup::kAttention, layer));
}

template <typename T>
struct AttentionGqa<T>::Scratch {
  Scratch(const ModelConfig& m, const PartSizes& s)
      : rope(RopeTable<T>::build(m.seq_len, m.head_dim, m.rope_theta)) {
    if (s.precision != Precision::kBf16) return;
    const size_t N = s.max_tokens, QD = size_t(m.n_heads) * m.head_dim, KVD = size_t(m.n_kv_heads) * m.head_dim;
    in16.resize(N * m.dim), dout16.resize(N * std::max({size_t(m.dim), QD, KVD}));
  }
  RopeTable<T> rope;                // [max(T, decoding length), HD/2]
  std::vector<bf16> in16, dout16;   // a product's bf16 input [N,C] and output gradient [N, max(C,QD,KVD)]
};

template <typename T>
AttentionGqa<T>::AttentionGqa(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s,
                              PartScratch& scratch)
    : m_(m), max_tokens_(s.max_tokens), sh_(scratch.get<Scratch>(m, s)) {
  const std::string pre = layer_prefix(layer) + "attn.";
  wq_ = layout.at(pre + "wq").offset, wk_ = layout.at(pre + "wk").offset;
  wv_ = layout.at(pre + "wv").offset, wo_ = layout.at(pre + "wo").offset;
  const size_t N = s.max_tokens, QD = size_t(m.n_heads) * m.head_dim, KVD = size_t(m.n_kv_heads) * m.head_dim;
  lse_.resize(size_t(s.max_batch) * m.n_heads * m.seq_len);
  q_.resize(N * QD, s.precision), k_.resize(N * KVD, s.precision), v_.resize(N * KVD, s.precision);
  att_.resize(N * QD, s.precision);
}

template <typename T>
size_t AttentionGqa<T>::work_elements() const {
  const size_t QD = size_t(m_.n_heads) * m_.head_dim, KVD = size_t(m_.n_kv_heads) * m_.head_dim;
  return size_t(max_tokens_) * (2 * QD + 2 * KVD);
}

namespace {

// The blocked attention kernels (backend/cpu/attention.h) in the precision q, k, v are kept in.
template <typename T>
void attention_any(Kept<T>& out, T* lse, const Kept<T>& q, const Kept<T>& k, const Kept<T>& v, int B, int T_, int NH,
                   int NKV, int HD) {
  if constexpr (kHasBf16<T>)
    if (!out.h.empty())
      return attention_forward_blocked_bf16(out.h.data(), lse, q.h.data(), k.h.data(), v.h.data(), B, T_, NH, NKV, HD);
  attention_forward_blocked(out.f.data(), lse, q.f.data(), k.f.data(), v.f.data(), B, T_, NH, NKV, HD);
}

template <typename T>
void attention_any_backward(T* dq, T* dk, T* dv, Operand<T> dout, const Kept<T>& out, const T* lse, const Kept<T>& q,
                            const Kept<T>& k, const Kept<T>& v, int B, int T_, int NH, int NKV, int HD) {
  if constexpr (kHasBf16<T>)
    if (!out.h.empty())
      return attention_backward_blocked_bf16(dq, dk, dv, dout.h, out.h.data(), lse, q.h.data(), k.h.data(),
                                             v.h.data(), B, T_, NH, NKV, HD);
  attention_backward_blocked(dq, dk, dv, dout.f, out.f.data(), lse, q.f.data(), k.f.data(), v.f.data(), B, T_, NH,
                             NKV, HD);
}

}  // namespace

template <typename T>
void AttentionGqa<T>::forward(T* out, const T* h, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::attention));
  const auto [T_, N, C, E, K, H, QD, KVD] = c.d;
  const int NH = m_.n_heads, NKV = m_.n_kv_heads, HD = m_.head_dim;
  // q, k, v in T for RoPE: in the kept buffers, or (bf16) in work and then kept in bf16.
  T* q = q_.values(c.work);
  T* k = k_.values(c.work + size_t(N) * QD);
  T* v = v_.values(c.work + size_t(N) * (QD + KVD));
  const Operand<T> in = c.mm.input(sh_->in16.data(), h, size_t(N) * C);
  c.mm.forward(q, in, c.mm.weight(wq_), N, C, QD);
  c.mm.forward(k, in, c.mm.weight(wk_), N, C, KVD);
  c.mm.forward(v, in, c.mm.weight(wv_), N, C, KVD);
  rope_forward(q, sh_->rope, c.B, T_, NH, HD);
  rope_forward(k, sh_->rope, c.B, T_, NKV, HD);
  q_.keep(q, size_t(N) * QD), k_.keep(k, size_t(N) * KVD), v_.keep(v, size_t(N) * KVD);
  attention_any(att_, lse_.data(), q_, k_, v_, c.B, T_, NH, NKV, HD);
  c.mm.forward(out, att_.operand(), c.mm.weight(wo_), N, QD, C);
}

template <typename T>
void AttentionGqa<T>::recompute_output(T* out, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::attention));
  c.mm.forward(out, att_.operand(), c.mm.weight(wo_), c.d.N, c.d.QD, c.d.C);
}

// The forward in reverse: wo, attention, RoPE (its inverse rotation), then wq, wk, wv.
template <typename T>
void AttentionGqa<T>::backward(T* dh, const T* dout, const T* h, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::attention));
  const auto [T_, N, C, E, K, H, QD, KVD] = c.d;
  const int NH = m_.n_heads, NKV = m_.n_kv_heads, HD = m_.head_dim;
  T* dq = c.work;  // [N,QD], [N,KVD] x2, [N,QD]
  T* dk = dq + size_t(N) * QD;
  T* dv = dk + size_t(N) * KVD;
  T* datt = dv + size_t(N) * KVD;
  bf16* dout16 = sh_->dout16.data();
  std::fill(datt, datt + size_t(N) * QD, T(0));
  c.mm.backward(datt, c.grads + wo_, c.mm.input(dout16, dout, size_t(N) * C), att_.operand(), c.mm.weight(wo_), N,
                QD, C);
  attention_any_backward(dq, dk, dv, c.mm.input(dout16, datt, size_t(N) * QD), att_, lse_.data(), q_, k_, v_, c.B,
                         T_, NH, NKV, HD);
  rope_backward(dq, sh_->rope, c.B, T_, NH, HD);
  rope_backward(dk, sh_->rope, c.B, T_, NKV, HD);
  const Operand<T> in = c.mm.input(sh_->in16.data(), h, size_t(N) * C);
  const struct { const T* d; size_t w; int out; } proj[] = {{dq, wq_, QD}, {dk, wk_, KVD}, {dv, wv_, KVD}};
  for (const auto& p : proj)
    c.mm.backward(dh, c.grads + p.w, c.mm.input(dout16, p.d, size_t(N) * p.out), in, c.mm.weight(p.w), N, C, p.out);
}

template <typename T>
void AttentionGqa<T>::start_decode(int max_len) {
  const size_t QD = size_t(m_.n_heads) * m_.head_dim, KVD = size_t(m_.n_kv_heads) * m_.head_dim;
  ATOLL_CHECK(q_.h.empty()) << "decoding runs fp32 products";
  if (sh_->rope.seq_len < max_len) sh_->rope = RopeTable<T>::build(max_len, m_.head_dim, m_.rope_theta);
  // resize, not assign: a grown cache keeps the positions already cached ([pos, KVD] rows).
  k_cache_.resize(size_t(max_len) * KVD, T(0)), v_cache_.resize(size_t(max_len) * KVD, T(0));
  dec_q_.resize(QD), dec_att_.resize(QD), score_.resize(max_len);
}

// One token at position pos: its key and value join the cache, its query attends to every
// cached position (all earlier ones and itself), softmax in T.
template <typename T>
void AttentionGqa<T>::decode(T* out, const T* h, int pos, const PartContext<T>& c) {
  const int C = m_.dim, HD = m_.head_dim, NH = m_.n_heads, NKV = m_.n_kv_heads, QD = NH * HD, KVD = NKV * HD;
  ATOLL_CHECK_LT(size_t(pos), score_.size()) << "decoder cache is full";
  T* kc = k_cache_.data() + size_t(pos) * KVD;
  T* vc = v_cache_.data() + size_t(pos) * KVD;
  const Operand<T> in = c.mm.input(sh_->in16.data(), h, size_t(C));
  c.mm.forward(dec_q_.data(), in, c.mm.weight(wq_), 1, C, QD);
  c.mm.forward(kc, in, c.mm.weight(wk_), 1, C, KVD);
  c.mm.forward(vc, in, c.mm.weight(wv_), 1, C, KVD);
  rope_forward(dec_q_.data(), sh_->rope, 1, 1, NH, HD, pos);
  rope_forward(kc, sh_->rope, 1, 1, NKV, HD, pos);
  const T scale = T(1) / std::sqrt(T(HD));
  for (int hd = 0; hd < NH; ++hd) {
    const int kh = hd / (NH / NKV);
    const T* q = dec_q_.data() + size_t(hd) * HD;
    T mx = -INFINITY;
    for (int s = 0; s <= pos; ++s) {
      const T* k = k_cache_.data() + size_t(s) * KVD + size_t(kh) * HD;
      score_[s] = std::inner_product(q, q + HD, k, T(0)) * scale;
      mx = std::max(mx, score_[s]);
    }
    T sum = 0;
    for (int s = 0; s <= pos; ++s) sum += (score_[s] = std::exp(score_[s] - mx));
    T* o = dec_att_.data() + size_t(hd) * HD;
    std::fill(o, o + HD, T(0));
    for (int s = 0; s <= pos; ++s) {
      const T* v = v_cache_.data() + size_t(s) * KVD + size_t(kh) * HD;
      for (int d = 0; d < HD; ++d) o[d] += score_[s] / sum * v[d];
    }
  }
  c.mm.forward(out, c.mm.input(sh_->in16.data(), dec_att_.data(), size_t(QD)), c.mm.weight(wo_), 1, QD, C);
}

template class AttentionGqa<float>;
template class AttentionGqa<double>;

}  // namespace atl
