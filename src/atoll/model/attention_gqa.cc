#include "atoll/model/attention_gqa.h"

#include <algorithm>
#include <cmath>

#include "atoll/core/check.h"
#include "atoll/layers/rmsnorm.h"
#include "atoll/model/attention_core.h"
#include "atoll/model/cached_attention.h"

namespace atl {

void attention_gqa_rows(ParamLayout& layout, const ModelConfig& m, int layer) {
  const std::string pre = layer_prefix(layer) + "attn.";
  const int64_t C = m.dim, QD = int64_t(m.n_heads) * m.head_dim, KVD = int64_t(m.n_kv_heads) * m.head_dim;
  layout.add(matrix_entry(pre + "wq", QD, C, ParamGroup::kAttention, layer));
  layout.add(matrix_entry(pre + "wk", KVD, C, ParamGroup::kAttention, layer));
  layout.add(matrix_entry(pre + "wv", KVD, C, ParamGroup::kAttention, layer));
  layout.add(matrix_entry(pre + "wo", C, QD, ParamGroup::kAttention, layer));
  if (m.qkv_bias) {
    layout.add(bias_entry(pre + "bq", QD, layer));
    layout.add(bias_entry(pre + "bk", KVD, layer));
    layout.add(bias_entry(pre + "bv", KVD, layer));
  }
  if (m.qk_norm == "none") return;
  const bool head = m.qk_norm == "head";
  layout.add(gain_entry(pre + "q_norm", head ? m.head_dim : QD, layer));
  layout.add(gain_entry(pre + "k_norm", head ? m.head_dim : KVD, layer));
}

template <typename T>
AttentionGqa<T>::AttentionGqa(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s,
                              PartScratch& scratch)
    : m_(m), layer_(layer), max_tokens_(s.max_tokens), qk_norm_(m.qk_norm != "none"),
      sh_(scratch.get<AttentionScratch<T>>(m, s)) {
  const std::string pre = layer_prefix(layer) + "attn.";
  wq_ = layout.at(pre + "wq").offset, wk_ = layout.at(pre + "wk").offset;
  wv_ = layout.at(pre + "wv").offset, wo_ = layout.at(pre + "wo").offset;
  if (m.qkv_bias) bq_ = layout.at(pre + "bq").offset, bk_ = layout.at(pre + "bk").offset, bv_ = layout.at(pre + "bv").offset;
  const size_t N = s.max_tokens, QD = size_t(m.n_heads) * m.head_dim, KVD = size_t(m.n_kv_heads) * m.head_dim;
  if (qk_norm_) {
    ATOLL_CHECK(m.qk_norm == "head" || m.qk_norm == "proj") << "model.qk_norm = " << m.qk_norm;
    q_norm_ = layout.at(pre + "q_norm").offset, k_norm_ = layout.at(pre + "k_norm").offset;
    q_raw_.resize(N * QD), k_raw_.resize(N * KVD);
    q_rstd_.resize(N * QD / norm_width(int(QD))), k_rstd_.resize(N * KVD / norm_width(int(KVD)));
  }
  lse_.resize(size_t(s.max_batch) * m.n_heads * m.seq_len);
  q_.resize(N * QD, s.precision), k_.resize(N * KVD, s.precision), v_.resize(N * KVD, s.precision);
  att_.resize(N * QD, s.precision);
}

template <typename T>
size_t AttentionGqa<T>::work_elements() const {
  const size_t QD = size_t(m_.n_heads) * m_.head_dim, KVD = size_t(m_.n_kv_heads) * m_.head_dim;
  return size_t(max_tokens_) * (2 * QD + (qk_norm_ ? 3 : 2) * KVD);
}

// The rows of x [N, width] of norm_width(width) entries each: RMSNorm with gain `gain`, in place.
template <typename T>
void AttentionGqa<T>::qk_norm_forward(T* x, std::vector<T>& raw, std::vector<T>& rstd, size_t gain, int N, int width,
                                      const PartContext<T>& c) {
  const int w = norm_width(width), rows = int(size_t(N) * width / w);
  std::copy(x, x + size_t(N) * width, raw.begin());
  rmsnorm_forward(x, rstd.data(), raw.data(), c.mm.param(gain), rows, w, m_.norm_eps);
}

template <typename T>
void AttentionGqa<T>::qk_norm_backward(T* dx, const T* dy, const std::vector<T>& raw, const std::vector<T>& rstd,
                                       size_t gain, int N, int width, const PartContext<T>& c) {
  const int w = norm_width(width), rows = int(size_t(N) * width / w);
  std::fill(dx, dx + size_t(N) * width, T(0));
  rmsnorm_backward(dx, c.grads + gain, dy, raw.data(), rstd.data(), c.mm.param(gain), rows, w);
}

// q/k/v bias: bias[width] added to every row of x [N, width]; backward: its gradient (+=) the
// column sums of dx.
template <typename T>
void AttentionGqa<T>::add_bias(T* x, size_t bias, int N, int width, const PartContext<T>& c) const {
  if (!m_.qkv_bias) return;
  const T* b = c.mm.param(bias);
  for (size_t n = 0; n < size_t(N); ++n)
    for (int i = 0; i < width; ++i) x[n * width + i] += b[i];
}

template <typename T>
void AttentionGqa<T>::bias_backward(const T* dx, size_t bias, int N, int width, const PartContext<T>& c) const {
  if (!m_.qkv_bias) return;
  T* db = c.grads + bias;
  for (size_t n = 0; n < size_t(N); ++n)
    for (int i = 0; i < width; ++i) db[i] += dx[n * width + i];
}

// The projections of h[N,C] with their biases and q/k norms (before RoPE): q[N,QD], k, v[N,KVD] (=).
template <typename T>
void AttentionGqa<T>::project(T* q, T* k, T* v, const T* h, int N, const PartContext<T>& c) {
  const int C = m_.dim, QD = m_.n_heads * m_.head_dim, KVD = m_.n_kv_heads * m_.head_dim;
  const Operand<T> in = c.mm.input(sh_->in16.data(), h, size_t(N) * C);
  c.mm.forward(q, in, c.mm.weight(wq_), N, C, QD);
  c.mm.forward(k, in, c.mm.weight(wk_), N, C, KVD);
  c.mm.forward(v, in, c.mm.weight(wv_), N, C, KVD);
  add_bias(q, bq_, N, QD, c), add_bias(k, bk_, N, KVD, c), add_bias(v, bv_, N, KVD, c);
  if (qk_norm_) {
    qk_norm_forward(q, q_raw_, q_rstd_, q_norm_, N, QD, c);
    qk_norm_forward(k, k_raw_, k_rstd_, k_norm_, N, KVD, c);
  }
}

template <typename T>
void AttentionGqa<T>::forward(T* out, const T* h, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::attention));
  const auto [T_, N, C, E, K, H, QD, KVD] = c.d;
  const int NH = m_.n_heads, NKV = m_.n_kv_heads, HD = m_.head_dim;
  // q, k, v in T for RoPE: in the kept buffers, or (bf16) in work and then kept in bf16.
  T* q = q_.values(c.work);
  T* k = k_.values(c.work + size_t(N) * QD);
  T* v = v_.values(c.work + size_t(N) * (QD + KVD));
  project(q, k, v, h, N, c);
  rope_at(q, sh_->rope_of(layer_), c.B, T_, NH, HD, c.pos, false);
  rope_at(k, sh_->rope_of(layer_), c.B, T_, NKV, HD, c.pos, false);
  q_.keep(q, size_t(N) * QD), k_.keep(k, size_t(N) * KVD), v_.keep(v, size_t(N) * KVD);
  attention_any(att_, lse_.data(), q_, k_, v_, c.B, T_, NH, NKV, HD, c);
  c.mm.forward(out, att_.operand(), c.mm.weight(wo_), N, QD, C);
}

template <typename T>
void AttentionGqa<T>::recompute_output(T* out, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::attention));
  c.mm.forward(out, att_.operand(), c.mm.weight(wo_), c.d.N, c.d.QD, c.d.C);
}

// The forward in reverse: wo, attention, RoPE (its inverse rotation), the q/k norms, then the
// biases and wq, wk, wv.
template <typename T>
void AttentionGqa<T>::backward(T* dh, const T* dout, const T* h, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::attention));
  // Named copies, not a structured binding: clang 14 cannot capture bindings in the lambdas below.
  const int T_ = c.d.T, N = c.d.N, C = c.d.C, QD = c.d.QD, KVD = c.d.KVD;
  const int NH = m_.n_heads, NKV = m_.n_kv_heads, HD = m_.head_dim;
  T* dq = c.work;  // [N,QD], [N,KVD] x2, [N,QD]
  T* dk = dq + size_t(N) * QD;
  T* dv = dk + size_t(N) * KVD;
  T* datt = dv + size_t(N) * KVD;
  bf16* dout16 = sh_->dout16.data();
  std::fill(datt, datt + size_t(N) * QD, T(0));
  c.mm.backward(datt, c.grads + wo_, c.mm.input(dout16, dout, size_t(N) * C), att_.operand(), c.mm.weight(wo_), N,
                QD, C);
  // The query path first: under context parallelism it runs while the ring's last transfer (the
  // dK/dV sums going home) travels. dh sums the projections in the order q, k, v either way.
  const Operand<T> in = c.mm.input(sh_->in16.data(), h, size_t(N) * C);
  const auto projection_backward = [&](const T* d, size_t w, size_t b, int out) {
    bias_backward(d, b, N, out, c);
    c.mm.backward(dh, c.grads + w, c.mm.input(dout16, d, size_t(N) * out), in, c.mm.weight(w), N, C, out);
  };
  const auto query_path = [&] {
    rope_at(dq, sh_->rope_of(layer_), c.B, T_, NH, HD, c.pos, true);
    if (qk_norm_) {  // d(att) is free now: it takes dq before the norm, the extra work rows dk's
      qk_norm_backward(datt, dq, q_raw_, q_rstd_, q_norm_, N, QD, c);
      dq = datt;
    }
    projection_backward(dq, wq_, bq_, QD);
  };
  attention_any_backward(dq, dk, dv, c.mm.input(dout16, datt, size_t(N) * QD), att_, lse_.data(), q_, k_, v_, c.B,
                         T_, NH, NKV, HD, c, query_path);
  rope_at(dk, sh_->rope_of(layer_), c.B, T_, NKV, HD, c.pos, true);
  if (qk_norm_) {
    T* dk_raw = datt + size_t(N) * QD;
    qk_norm_backward(dk_raw, dk, k_raw_, k_rstd_, k_norm_, N, KVD, c);
    dk = dk_raw;
  }
  projection_backward(dk, wk_, bk_, KVD);
  projection_backward(dv, wv_, bv_, KVD);
}

template <typename T>
void AttentionGqa<T>::start_decode(int max_len, int cache_rows) {
  max_len_ = max_len;
  const size_t QD = size_t(m_.n_heads) * m_.head_dim, KVD = size_t(m_.n_kv_heads) * m_.head_dim;
  ATOLL_CHECK(q_.h.empty()) << "decoding runs fp32 products";
  sh_->grow_rope(max_len);
  // resize, not assign: a grown cache keeps the positions already cached ([pos, KVD] rows).
  k_cache_.resize(size_t(cache_rows) * KVD, T(0)), v_cache_.resize(size_t(cache_rows) * KVD, T(0));
  dec_q_.resize(QD), dec_att_.resize(QD), dec_kv_.resize(2 * KVD);
  if (qk_norm_) q_raw_.resize(std::max(q_raw_.size(), QD)), k_raw_.resize(std::max(k_raw_.size(), KVD));
}

// One token at position pos: its key and value join the cache, its query attends to every
// cached position (all earlier ones and itself), softmax in T.
template <typename T>
void AttentionGqa<T>::decode(T* out, const T* h, int pos, const PartContext<T>& c) {
  const int C = m_.dim, HD = m_.head_dim, NH = m_.n_heads, NKV = m_.n_kv_heads, QD = NH * HD, KVD = NKV * HD;
  ATOLL_CHECK_LT(pos, max_len_) << "decoder cache is full";
  // This rank's cache row of the position, or scratch when another rank holds it (tree attention).
  const CacheShard shard = CacheShard::of(c);
  T* kc = shard.holds(pos) ? k_cache_.data() + size_t(shard.row(pos)) * KVD : dec_kv_.data();
  T* vc = shard.holds(pos) ? v_cache_.data() + size_t(shard.row(pos)) * KVD : dec_kv_.data() + KVD;
  project(dec_q_.data(), kc, vc, h, 1, c);
  rope_forward(dec_q_.data(), sh_->rope_of(layer_), 1, 1, NH, HD, pos);
  rope_forward(kc, sh_->rope_of(layer_), 1, 1, NKV, HD, pos);
  attend_cached_any(dec_att_.data(), dec_q_.data(), k_cache_.data(), v_cache_.data(), pos, NH, NKV, HD,
                    c);
  c.mm.forward(out, c.mm.input(sh_->in16.data(), dec_att_.data(), size_t(QD)), c.mm.weight(wo_), 1, QD, C);
}

// A block of tokens: decode's steps on N rows at once (the products batched), their keys and
// values into the cache, then the block's queries against the cache up to each one's position.
template <typename T>
void AttentionGqa<T>::prefill(T* out, const T* h, int pos, const PartContext<T>& c) {
  const int N = c.d.N, C = m_.dim, HD = m_.head_dim, NH = m_.n_heads, NKV = m_.n_kv_heads, QD = NH * HD,
            KVD = NKV * HD;
  ATOLL_CHECK_LE(N, max_tokens_) << "prefill block";
  ATOLL_CHECK_LE(pos + N, max_len_) << "decoder cache is full";
  T* q = c.work;  // [N,QD], [N,KVD] x2, [N,QD]
  T* k = q + size_t(N) * QD;
  T* v = k + size_t(N) * KVD;
  T* att = v + size_t(N) * KVD;
  project(q, k, v, h, N, c);
  rope_forward(q, sh_->rope_of(layer_), 1, N, NH, HD, pos);
  rope_forward(k, sh_->rope_of(layer_), 1, N, NKV, HD, pos);
  const CacheShard shard = CacheShard::of(c);
  cache_block(k_cache_.data(), v_cache_.data(), k, v, N, pos, KVD, shard);
  attend_prefix(att, q, k_cache_.data(), v_cache_.data(), N, pos, NH, NKV, HD, shard, c.cp);
  c.mm.forward(out, c.mm.input(sh_->in16.data(), att, size_t(N) * QD), c.mm.weight(wo_), N, QD, C);
}

template class AttentionGqa<float>;
template class AttentionGqa<double>;

}  // namespace atl
