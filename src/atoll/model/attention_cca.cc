#include "atoll/model/attention_cca.h"

#include <algorithm>
#include <functional>
#include <numeric>

#include "atoll/backend/cpu/cca_conv.h"
#include "atoll/core/check.h"
#include "atoll/model/attention_core.h"
#include "atoll/model/cca_boundary.h"
#include "atoll/model/chunk_boundary.h"
#include "atoll/model/cached_attention.h"

namespace atl {

void attention_cca_rows(ParamLayout& layout, const ModelConfig& m, int layer) {
  const std::string pre = layer_prefix(layer) + "attn.", qkv = pre + "qkv_proj.";
  const CcaDims d = cca_dims(m, 1, 1);
  const int64_t C = m.dim, QD = d.QD(), KVD = d.KVD(), CC = d.CC(), HD = d.HD;
  layout.add(matrix_entry(qkv + "q_proj.weight", QD, C, ParamGroup::kAttention, layer));
  layout.add(matrix_entry(qkv + "k_proj.weight", KVD, C, ParamGroup::kAttention, layer));
  layout.add(matrix_entry(qkv + "v_proj_current.weight", KVD / 2, C, ParamGroup::kAttention, layer));
  layout.add(matrix_entry(qkv + "v_proj_delayed.weight", KVD / 2, C, ParamGroup::kAttention, layer));
  auto conv_row = [&](std::string name, std::vector<int64_t> shape, ParamInit init) {
    const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<>());
    layout.add({.name = std::move(name), .shape = std::move(shape), .group = ParamGroup::kConv, .layer = layer,
                .matrix_cols = n, .init = init});
  };
  conv_row(qkv + "conv_qk_depthwise.weight", {CC, 1, d.t0}, ParamInit::kNormal);
  conv_row(qkv + "conv_qk_depthwise.bias", {CC}, ParamInit::kZeros);
  layout.add({.name = qkv + "conv_qk_grouped.weight", .shape = {CC, HD, d.t1}, .group = ParamGroup::kAttention,
              .layer = layer, .matrix_count = m.n_heads + m.n_kv_heads, .matrix_rows = HD, .matrix_cols = HD * d.t1});
  conv_row(qkv + "conv_qk_grouped.bias", {CC}, ParamInit::kZeros);
  layout.add(gain_entry(pre + "qk_norm.temp", m.n_kv_heads, layer));  // ones: see the header
  layout.add(matrix_entry(pre + "o_proj.weight", C, QD, ParamGroup::kAttention, layer));
}

CcaDims cca_dims(const ModelConfig& m, int B, int T) {
  return {.B = B, .T = T, .C = m.dim, .NH = m.n_heads, .NKV = m.n_kv_heads, .HD = m.head_dim, .t0 = m.cca_time0,
          .t1 = m.cca_time1};
}

template <typename T>
AttentionCca<T>::AttentionCca(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s,
                              PartScratch& scratch)
    : m_(m), layer_(layer), max_batch_(s.max_batch), max_tokens_(s.max_tokens), sh_(scratch.get<AttentionScratch<T>>(m, s)) {
  const std::string pre = layer_prefix(layer) + "attn.", qkv = pre + "qkv_proj.";
  auto at = [&](const std::string& name) { return layout.at(name).offset; };
  w_ = {.wq = at(qkv + "q_proj.weight"), .wk = at(qkv + "k_proj.weight"), .wvc = at(qkv + "v_proj_current.weight"),
        .wvd = at(qkv + "v_proj_delayed.weight"), .w0 = at(qkv + "conv_qk_depthwise.weight"),
        .b0 = at(qkv + "conv_qk_depthwise.bias"), .w1 = at(qkv + "conv_qk_grouped.weight"),
        .b1 = at(qkv + "conv_qk_grouped.bias"), .temp = at(pre + "qk_norm.temp"), .wo = at(pre + "o_proj.weight")};
  const CcaDims d = cca_dims(m, s.max_batch, m.seq_len);
  const size_t N = s.max_tokens;
  x_.resize(x_rows_max() * d.CC()), y_.resize(y_rows_max() * d.CC());
  q_.resize(N * d.QD()), k_.resize(N * d.KVD()), rq_.resize(N * d.NH), rk_.resize(N * d.NKV);
  qn_.resize(N * d.QD(), s.precision), kn_.resize(N * d.KVD(), s.precision), v_.resize(N * d.KVD(), s.precision);
  att_.resize(N * d.QD(), s.precision);
  lse_.resize(size_t(s.max_batch) * m.n_heads * m.seq_len);
  const size_t W = size_t(lag()) * d.CC() + d.KVD() / 2;
  tails_.resize(TokenPositions::kMaxRuns * size_t(s.max_batch) * W);
  heads_.resize(tails_.size());
}

template <typename T>
size_t AttentionCca<T>::x_rows_max() const {
  return cca_x_rows_max(max_tokens_, max_batch_, lag());
}
template <typename T>
size_t AttentionCca<T>::y_rows_max() const {
  return cca_y_rows_max(max_tokens_, max_batch_, lag(), m_.cca_time1);
}

template <typename T>
size_t AttentionCca<T>::work_elements() const {
  const CcaDims d = cca_dims(m_, max_batch_, m_.seq_len);
  // backward's: d(att), dqn, dq [N,QD]; dkn, dv, dk, dvc + dvd [N,KVD]; dz, dx [x rows,CC]; dy [y rows,CC]
  // (forward needs less: qn, kn, v, z, vc, vd).
  return size_t(max_tokens_) * (3 * d.QD() + 4 * d.KVD()) + (2 * x_rows_max() + y_rows_max()) * d.CC();
}

namespace {

// Packs rows a[N,A] and b[N,B'] side by side into out[N, A+B'], or back (unpack).
template <typename T>
void pack_rows(T* out, const T* a, const T* b, int N, int A, int Bw) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    std::copy_n(a + size_t(n) * A, A, out + size_t(n) * (A + Bw));
    std::copy_n(b + size_t(n) * Bw, Bw, out + size_t(n) * (A + Bw) + A);
  }
}
template <typename T>
void unpack_rows(T* a, T* b, const T* in, int N, int A, int Bw) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    std::copy_n(in + size_t(n) * (A + Bw), A, a + size_t(n) * A);
    std::copy_n(in + size_t(n) * (A + Bw) + A, Bw, b + size_t(n) * Bw);
  }
}

}  // namespace

// Context parallelism, before the convolutions: each run's last lag x rows and delayed value
// half go to the holder of the chunk after it; the predecessors' arrive as the runs' boundary
// rows in x_ and in heads_ (model/cca_boundary.h lays the messages out).
template <typename T>
CcaBoundary AttentionCca<T>::boundary(const PartContext<T>& c) const {
  const CcaDims d = cca_dims(m_, c.B, c.d.T);
  ATOLL_CHECK(c.cp && c.zigzag && c.pos.runs == 2) << "CCA on chunks of sequences runs in a context-parallel group";
  ATOLL_CHECK(!c.zigzag->contiguous) << "CCA's boundary exchange pairs the zigzag layout's neighbours";
  return cca_boundary(cca_runs(c.pos, c.B, d.T, lag(), d.t1), c.B, d.T, lag(), d.CC(), d.KVD());
}

template <typename T>
void AttentionCca<T>::boundary_forward(const T* vd, const PartContext<T>& c) {
  const CcaBoundary p = boundary(c);
  cca_pack_tails(tails_.data(), x_.data(), vd, p);
  chunk_tails_forward(heads_.data(), heads_.data() + p.per_run, tails_.data(), tails_.data() + p.per_run, p.per_run,
                      *c.cp);
  cca_unpack_heads(x_.data(), heads_.data(), p);
}

// Backward, after the convolutions': the gradients of each run's boundary rows (dx's) and of its
// predecessor's delayed value half (dv's) go back to the holder of the chunk before, which adds
// them to its tail rows' dx and sets its last token's dvd.
template <typename T>
void AttentionCca<T>::boundary_backward(T* dx, T* dvd, const T* dv, const PartContext<T>& c) {
  const CcaBoundary p = boundary(c);
  cca_pack_dheads(heads_.data(), dx, dv, p);
  chunk_heads_backward(tails_.data(), tails_.data() + p.per_run, heads_.data(), heads_.data() + p.per_run, p.per_run,
                       *c.cp);
  cca_unpack_dtails(dx, dvd, tails_.data(), p);
}

template <typename T>
void AttentionCca<T>::forward(T* out, const T* h, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::attention));
  const CcaDims d = cca_dims(m_, c.B, c.d.T);
  const int N = d.N(), C = d.C, QD = d.QD(), KVD = d.KVD(), CC = d.CC();
  const CcaRuns R = cca_runs(c.pos, c.B, d.T, lag(), d.t1);
  // qn, kn, v in T for RoPE and attention: in the kept buffers, or (bf16) in work and kept in bf16.
  T* qn = qn_.values(c.work);
  T* kn = kn_.values(c.work + size_t(N) * QD);
  T* v = v_.values(c.work + size_t(N) * (QD + KVD));
  T* z = c.work + size_t(N) * (QD + 2 * KVD);  // [x rows,CC]
  T* vc = z + R.x_rows * CC;                    // [N,KVD/2] x2
  T* vd = vc + size_t(N) * KVD / 2;
  const Operand<T> in = c.mm.input(sh_->in16.data(), h, size_t(N) * C);
  c.mm.forward(q_.data(), in, c.mm.weight(w_.wq), N, C, QD);  // qp and kp, packed into x
  c.mm.forward(k_.data(), in, c.mm.weight(w_.wk), N, C, KVD);
  cca_for_each_span(R, c.B, d.T, [&](size_t l, size_t xr, int n) {
    pack_rows(x_.data() + xr * CC, q_.data() + l * QD, k_.data() + l * KVD, n, QD, KVD);
  });
  c.mm.forward(vc, in, c.mm.weight(w_.wvc), N, C, KVD / 2);
  c.mm.forward(vd, in, c.mm.weight(w_.wvd), N, C, KVD / 2);
  if (!c.pos.whole()) boundary_forward(vd, c);
  for (int i = 0; i < R.n; ++i) {  // each run over [boundary | its tokens]
    const CcaRun& u = R.run[i];
    cpu::cca_conv_forward(z + u.x_row * CC, y_.data() + u.y_row * CC, x_.data() + u.x_row * CC, c.mm.param(w_.w0),
                          c.mm.param(w_.b0), c.mm.param(w_.w1), c.mm.param(w_.b1), cca_dims(m_, c.B, u.rows()));
  }
  cca_for_each_span(R, c.B, d.T, [&](size_t l, size_t xr, int n) {
    cca_qk_mean_forward(q_.data() + l * QD, k_.data() + l * KVD, z + xr * CC, x_.data() + xr * CC,
                        cca_dims(m_, 1, n));
  });
  cca_qk_norm_forward(qn, kn, rq_.data(), rk_.data(), q_.data(), k_.data(), c.mm.param(w_.temp), d);
  rope_at(qn, sh_->rope_of(layer_), c.B, d.T, d.NH, d.HD, c.pos, false);
  rope_at(kn, sh_->rope_of(layer_), c.B, d.T, d.NKV, d.HD, c.pos, false);
  cca_value_forward(v, vc, vd, d);
  if (!c.pos.whole()) cca_shift_values(v, heads_.data(), boundary(c));
  qn_.keep(qn, size_t(N) * QD), kn_.keep(kn, size_t(N) * KVD), v_.keep(v, size_t(N) * KVD);
  attention_any(att_, lse_.data(), qn_, kn_, v_, c.B, d.T, d.NH, d.NKV, d.HD, c);
  c.mm.forward(out, att_.operand(), c.mm.weight(w_.wo), N, QD, C);
}

template <typename T>
void AttentionCca<T>::recompute_output(T* out, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::attention));
  c.mm.forward(out, att_.operand(), c.mm.weight(w_.wo), c.d.N, c.d.QD, c.d.C);
}

// The forward in reverse: o_proj, attention, RoPE, the norms, the qk-mean skip, the
// convolutions, then the four projections.
template <typename T>
void AttentionCca<T>::backward(T* dh, const T* dout, const T* h, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::attention));
  const CcaDims d = cca_dims(m_, c.B, c.d.T);
  const int N = d.N(), C = d.C, QD = d.QD(), KVD = d.KVD(), CC = d.CC();
  const CcaRuns R = cca_runs(c.pos, c.B, d.T, lag(), d.t1);
  T* datt = c.work;
  T* dqn = datt + size_t(N) * QD;
  T* dq = dqn + size_t(N) * QD;
  T* dkn = dq + size_t(N) * QD;
  T* dv = dkn + size_t(N) * KVD;
  T* dk = dv + size_t(N) * KVD;
  T* dvc = dk + size_t(N) * KVD;
  T* dvd = dvc + size_t(N) * KVD / 2;
  T* dz = dvd + size_t(N) * KVD / 2;  // [x rows,CC] x2
  T* dx = dz + R.x_rows * CC;
  T* dy = dx + R.x_rows * CC;  // [y rows,CC]
  T* g = c.grads;
  bf16* dout16 = sh_->dout16.data();
  std::fill(datt, datt + size_t(N) * QD, T(0));
  c.mm.backward(datt, g + w_.wo, c.mm.input(dout16, dout, size_t(N) * C), att_.operand(), c.mm.weight(w_.wo), N, QD,
                C);
  // The queries' RoPE runs while the ring's last transfer travels (context parallelism); the
  // norms below need dk too.
  attention_any_backward(dqn, dkn, dv, c.mm.input(dout16, datt, size_t(N) * QD), att_, lse_.data(), qn_, kn_, v_,
                         c.B, d.T, d.NH, d.NKV, d.HD, c,
                         [&] { rope_at(dqn, sh_->rope_of(layer_), c.B, d.T, d.NH, d.HD, c.pos, true); });
  rope_at(dkn, sh_->rope_of(layer_), c.B, d.T, d.NKV, d.HD, c.pos, true);
  cca_qk_norm_backward(dq, dk, g + w_.temp, dqn, dkn, q_.data(), k_.data(), rq_.data(), rk_.data(),
                       c.mm.param(w_.temp), d);
  std::fill(dx, dx + R.x_rows * CC, T(0));
  if (!c.pos.whole()) std::fill(dz, dz + R.x_rows * CC, T(0));  // the boundary rows' outputs are dropped
  cca_for_each_span(R, c.B, d.T, [&](size_t l, size_t xr, int n) {
    cca_qk_mean_backward(dz + xr * CC, dx + xr * CC, dq + l * QD, dk + l * KVD, cca_dims(m_, 1, n));
  });
  for (int i = 0; i < R.n; ++i) {
    const CcaRun& u = R.run[i];
    cpu::cca_conv_backward(dx + u.x_row * CC, g + w_.w0, g + w_.b0, g + w_.w1, g + w_.b1, dy + u.y_row * CC,
                           dz + u.x_row * CC, y_.data() + u.y_row * CC, x_.data() + u.x_row * CC, c.mm.param(w_.w0),
                           c.mm.param(w_.w1), cca_dims(m_, c.B, u.rows()));
  }
  cca_value_backward(dvc, dvd, dv, d);
  if (!c.pos.whole()) boundary_backward(dx, dvd, dv, c);
  cca_for_each_span(R, c.B, d.T, [&](size_t l, size_t xr, int n) {
    unpack_rows(dq + l * QD, dk + l * KVD, dx + xr * CC, n, QD, KVD);  // d(qp), d(kp)
  });
  const Operand<T> in = c.mm.input(sh_->in16.data(), h, size_t(N) * C);
  const struct { const T* d; size_t w; int out; } proj[] = {
      {dq, w_.wq, QD}, {dk, w_.wk, KVD}, {dvc, w_.wvc, KVD / 2}, {dvd, w_.wvd, KVD / 2}};
  for (const auto& p : proj)
    c.mm.backward(dh, g + p.w, c.mm.input(dout16, p.d, size_t(N) * p.out), in, c.mm.weight(p.w), N, C, p.out);
}

template <typename T>
void AttentionCca<T>::start_decode(int max_len, int cache_rows) {
  max_len_ = max_len;
  ATOLL_CHECK(qn_.h.empty()) << "decoding runs fp32 products";
  const CcaDims d = cca_dims(m_, 1, 1);
  const int P = d.t0 - 1 + d.t1 - 1;
  sh_->grow_rope(max_len);
  // resize, not assign: a grown cache keeps what is cached so far.
  k_cache_.resize(size_t(cache_rows) * d.KVD(), T(0)), v_cache_.resize(size_t(cache_rows) * d.KVD(), T(0));
  window_.resize(size_t(P + 1) * d.CC(), T(0)), prev_vd_.resize(d.KVD() / 2, T(0));
  dec_y_.resize(size_t(P + d.t1) * d.CC()), dec_z_.resize(size_t(P + 1) * d.CC());
  dec_q_.resize(d.QD()), dec_k_.resize(d.KVD()), dec_qn_.resize(d.QD()), dec_att_.resize(d.QD());
  dec_rq_.resize(d.NH), dec_rk_.resize(d.NKV), dec_kv_.resize(2 * size_t(d.KVD()));
}

// One token at position pos. Its pre-convolution [q|k] row joins the window of the last P rows
// (zeros before the sequence, exactly the training forward's padding), and the convolutions run
// over that window: the last output reads nothing older. Position 0 starts a new sequence.
template <typename T>
void AttentionCca<T>::decode(T* out, const T* h, int pos, const PartContext<T>& c) {
  const int P = m_.cca_time0 - 1 + m_.cca_time1 - 1;
  const CcaDims one = cca_dims(m_, 1, 1), win = cca_dims(m_, 1, P + 1);
  const int C = one.C, QD = one.QD(), KVD = one.KVD(), CC = one.CC();
  ATOLL_CHECK_LT(pos, max_len_) << "decoder cache is full";
  if (pos == 0)
    std::fill(window_.begin(), window_.end(), T(0)), std::fill(prev_vd_.begin(), prev_vd_.end(), T(0));
  else
    std::copy(window_.begin() + CC, window_.end(), window_.begin());
  T* xt = window_.data() + size_t(P) * CC;
  // This rank's cache row of the position, or scratch when another rank holds it (tree attention).
  const CacheShard shard = CacheShard::of(c);
  T* kc = shard.holds(pos) ? k_cache_.data() + size_t(shard.row(pos)) * KVD : dec_kv_.data();
  T* vc = shard.holds(pos) ? v_cache_.data() + size_t(shard.row(pos)) * KVD : dec_kv_.data() + KVD;
  const Operand<T> in = c.mm.input(sh_->in16.data(), h, size_t(C));
  c.mm.forward(xt, in, c.mm.weight(w_.wq), 1, C, QD);
  c.mm.forward(xt + QD, in, c.mm.weight(w_.wk), 1, C, KVD);
  cca_conv_forward(dec_z_.data(), dec_y_.data(), window_.data(), c.mm.param(w_.w0), c.mm.param(w_.b0),
                   c.mm.param(w_.w1), c.mm.param(w_.b1), win);
  cca_qk_mean_forward(dec_q_.data(), dec_k_.data(), dec_z_.data() + size_t(P) * CC, xt, one);
  cca_qk_norm_forward(dec_qn_.data(), kc, dec_rq_.data(), dec_rk_.data(), dec_q_.data(), dec_k_.data(),
                      c.mm.param(w_.temp), one);
  rope_forward(dec_qn_.data(), sh_->rope_of(layer_), 1, 1, one.NH, one.HD, pos);
  rope_forward(kc, sh_->rope_of(layer_), 1, 1, one.NKV, one.HD, pos);
  // The value: this token's current half, the previous token's delayed half (0 at position 0).
  c.mm.forward(vc, in, c.mm.weight(w_.wvc), 1, C, KVD / 2);
  std::copy(prev_vd_.begin(), prev_vd_.end(), vc + KVD / 2);
  c.mm.forward(prev_vd_.data(), in, c.mm.weight(w_.wvd), 1, C, KVD / 2);
  attend_cached_any(dec_att_.data(), dec_qn_.data(), k_cache_.data(), v_cache_.data(), pos, one.NH,
                    one.NKV, one.HD, c);
  c.mm.forward(out, c.mm.input(sh_->in16.data(), dec_att_.data(), size_t(QD)), c.mm.weight(w_.wo), 1, QD, C);
}

// A block of N tokens at positions [pos, pos + N): x = [the lag rows before the block (the
// window's, zeros at position 0) | the block's pre-convolution rows], convolved as one run, the
// first lag outputs dropped; the value shift takes the kept delayed half for the first token.
// The window and the delayed half are left as the decode steps over the block would leave them.
template <typename T>
void AttentionCca<T>::prefill(T* out, const T* h, int pos, const PartContext<T>& c) {
  const int L = lag(), N = c.d.N;
  const CcaDims d = cca_dims(m_, 1, N);
  const int C = d.C, QD = d.QD(), KVD = d.KVD(), CC = d.CC(), half = KVD / 2;
  ATOLL_CHECK_LE(N, max_tokens_) << "prefill block";
  ATOLL_CHECK_LE(pos + N, max_len_) << "decoder cache is full";
  T* qn = c.work;  // [N,QD], [N,KVD] x2, [L+N,CC], [N,KVD/2] x2, [N,QD]
  T* kn = qn + size_t(N) * QD;
  T* v = kn + size_t(N) * KVD;
  T* z = v + size_t(N) * KVD;
  T* vc = z + size_t(L + N) * CC;
  T* vd = vc + size_t(N) * half;
  T* att = vd + size_t(N) * half;
  if (pos == 0)
    std::fill(window_.begin(), window_.end(), T(0)), std::fill(prev_vd_.begin(), prev_vd_.end(), T(0));
  std::copy(window_.begin() + CC, window_.end(), x_.begin());  // its last L rows: positions [pos-L, pos)
  const Operand<T> in = c.mm.input(sh_->in16.data(), h, size_t(N) * C);
  c.mm.forward(q_.data(), in, c.mm.weight(w_.wq), N, C, QD);
  c.mm.forward(k_.data(), in, c.mm.weight(w_.wk), N, C, KVD);
  pack_rows(x_.data() + size_t(L) * CC, q_.data(), k_.data(), N, QD, KVD);
  cpu::cca_conv_forward(z, y_.data(), x_.data(), c.mm.param(w_.w0), c.mm.param(w_.b0), c.mm.param(w_.w1),
                        c.mm.param(w_.b1), cca_dims(m_, 1, L + N));
  cca_qk_mean_forward(q_.data(), k_.data(), z + size_t(L) * CC, x_.data() + size_t(L) * CC, d);
  cca_qk_norm_forward(qn, kn, rq_.data(), rk_.data(), q_.data(), k_.data(), c.mm.param(w_.temp), d);
  rope_forward(qn, sh_->rope_of(layer_), 1, N, d.NH, d.HD, pos);
  rope_forward(kn, sh_->rope_of(layer_), 1, N, d.NKV, d.HD, pos);
  c.mm.forward(vc, in, c.mm.weight(w_.wvc), N, C, half);
  c.mm.forward(vd, in, c.mm.weight(w_.wvd), N, C, half);
  cca_value_forward(v, vc, vd, d);
  std::copy(prev_vd_.begin(), prev_vd_.end(), v + half);
  std::copy_n(vd + size_t(N - 1) * half, half, prev_vd_.begin());
  std::copy_n(x_.data() + size_t(N - 1) * CC, window_.size(), window_.begin());  // positions [pos+N-1-L, pos+N)
  const CacheShard shard = CacheShard::of(c);
  cache_block(k_cache_.data(), v_cache_.data(), kn, v, N, pos, KVD, shard);
  attend_prefix(att, qn, k_cache_.data(), v_cache_.data(), N, pos, d.NH, d.NKV, d.HD, shard, c.cp);
  c.mm.forward(out, c.mm.input(sh_->in16.data(), att, size_t(N) * QD), c.mm.weight(w_.wo), N, QD, C);
}

template class AttentionCca<float>;
template class AttentionCca<double>;

}  // namespace atl
