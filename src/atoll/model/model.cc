#include "atoll/model/model.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "atoll/core/check.h"
#include "atoll/core/rng.h"
#include "atoll/core/timer.h"
#include "atoll/backend/cpu/attention.h"
#include "atoll/backend/cpu/expert_mlp.h"
#include "atoll/backend/cpu/expert_mlp_bf16.h"
#include "atoll/backend/cpu/linear_bf16.h"
#include "atoll/core/errors.h"
#include "atoll/layers/cross_entropy.h"
#include "atoll/layers/embedding.h"
#include "atoll/backend/cpu/linear.h"
#include "atoll/layers/moe_dispatch.h"
#include "atoll/layers/rmsnorm.h"
#include "atoll/layers/rope.h"
#include "atoll/layers/router.h"
#include "atoll/model/model_buffers.h"

namespace atl {

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  throw ConfigError(std::string("train.precision = \"").append(name).append("\" is not one of fp32, bf16"));
}

const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

// Only Model<float> has the bf16 path; the branches below compile away for double.
template <typename T>
constexpr bool kFloat = std::is_same_v<T, float>;

template <typename T>
Model<T>::Model(const ModelConfig& cfg, int max_batch, Precision precision)
    : cfg_(cfg), layout_(ParamLayout::build(cfg)), max_batch_(max_batch), precision_(precision) {
  ATOLL_CHECK_GE(max_batch, 1);
  ATOLL_CHECK(kFloat<T> || precision == Precision::kFp32) << "bf16 products need Model<float>";
  params_.assign(layout_.total(), T(0));
  grads_.assign(layout_.total(), T(0));
  act_ = std::make_unique<Activations>(cfg, max_batch, is_bf16());
}

template <typename T>
Model<T>::~Model() = default;

template <typename T>
void Model<T>::init_params(uint64_t seed) {
  Rng rng(seed);
  std::fill(params_.begin(), params_.end(), T(0));
  for (const ParamEntry& e : layout_.entries()) {
    T* p = params_.data() + e.offset;
    for (size_t i = 0; i < e.numel; ++i) p[i] = e.group == ParamGroup::kNorm ? T(1) : T(rng.normal() * cfg_.init_std);
  }
}

template <typename T>
void Model<T>::zero_grads() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

template <typename T>
LossParts Model<T>::forward_backward(const int32_t* inputs, const int32_t* targets, int B, double loss_scale) {
  return run(inputs, targets, B, true, loss_scale);
}

template <typename T>
LossParts Model<T>::forward(const int32_t* inputs, const int32_t* targets, int B) {
  return run(inputs, targets, B, false, 0.0);
}

template <typename T>
LossParts Model<T>::run(const int32_t* inputs, const int32_t* targets, int B, bool backward, double loss_scale) {
  ATOLL_CHECK(B >= 1 && B <= max_batch_) << "batch of " << B << " sequences, model sized for " << max_batch_;
  Activations& A = *act_;
  const int N = B * cfg_.seq_len, C = cfg_.dim;
  std::memcpy(A.tokens.data(), inputs, sizeof(int32_t) * N);
  if constexpr (kFloat<T>)
    if (is_bf16()) {  // the parameters may have changed since the last call (optimizer, checkpoint, sync)
      ScopedTimer t(&times_.weights_bf16);
      to_bf16(A.head16.data(), params_.data() + A.head_offset, A.head16.size());
      A.w16_block = -1;
    }
  {
    ScopedTimer t(&times_.embed);
    embedding_forward(A.x[0].data(), inputs, param("embed"), N, C, cfg_.vocab_size);
  }
  LossParts loss;
  for (int l = 0; l < cfg_.n_layers; ++l) {
    forward_block(l, B);
    loss.aux += A.layers[l].losses.aux;
    loss.z += A.layers[l].losses.z;
  }
  loss.ce = head_and_loss(targets, B, backward, loss_scale) / N;
  if (!backward) return loss;
  for (int l = cfg_.n_layers - 1; l >= 0; --l) backward_block(l, B, loss_scale);
  ScopedTimer t(&times_.embed);
  embedding_backward(grads_.data() + layout_.at("embed").offset, A.dx.data(), A.tokens.data(), N, C);
  return loss;
}

template <typename T>
typename Model<T>::BlockWeights16 Model<T>::block_weights16(int l) {
  Activations& A = *act_;
  const LayerOffsets& o = A.offsets[l];
  if constexpr (kFloat<T>)
    if (A.w16_block != l) {
      ScopedTimer t(&times_.weights_bf16);
      to_bf16(A.w16.data(), params_.data() + o.attn_norm, o.end - o.attn_norm);
      A.w16_block = l;
    }
  return {A.w16.data(), o.attn_norm};
}

namespace {
// out = a + b over n elements (the residual adds), split over the threads.
template <typename T>
void add(T* out, const T* a, const T* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace

template <typename T>
void Model<T>::forward_block(int l, int B) {
  Activations& A = *act_;
  typename Activations::Layer& S = A.layers[l];
  const LayerOffsets& o = A.offsets[l];
  const ModelConfig& m = cfg_;
  const auto [T_, N, C, E, K, H, QD, KVD] = block_dims(m, B);
  const T* p = params_.data();
  const T* x = A.x[l].data();
  const BlockWeights16 w16 = is_bf16() ? block_weights16(l) : BlockWeights16{nullptr, 0};
  {
    ScopedTimer t(&times_.attention);
    T* h1 = A.hn.data();  // [N,C], recomputed in backward
    rmsnorm_forward(h1, S.rstd1.data(), x, p + o.attn_norm, N, C, m.norm_eps);
    if constexpr (kFloat<T>)
      if (is_bf16()) {  // q, k, v in fp32 scratch for RoPE, then kept in bf16
        to_bf16(A.in16.data(), h1, size_t(N) * C);
        linear_forward_bf16(A.dq, A.in16.data(), w16.at(o.wq), N, C, QD);
        linear_forward_bf16(A.dk, A.in16.data(), w16.at(o.wk), N, C, KVD);
        linear_forward_bf16(A.dv, A.in16.data(), w16.at(o.wv), N, C, KVD);
        rope_forward(A.dq, A.rope, B, T_, m.n_heads, m.head_dim);
        rope_forward(A.dk, A.rope, B, T_, m.n_kv_heads, m.head_dim);
        to_bf16(S.q16.data(), A.dq, size_t(N) * QD);
        to_bf16(S.k16.data(), A.dk, size_t(N) * KVD);
        to_bf16(S.v16.data(), A.dv, size_t(N) * KVD);
        attention_forward_blocked_bf16(S.att16.data(), S.lse.data(), S.q16.data(), S.k16.data(), S.v16.data(), B, T_,
                                       m.n_heads, m.n_kv_heads, m.head_dim);
        linear_forward_bf16(A.tmp.data(), S.att16.data(), w16.at(o.wo), N, QD, C);
      }
    if (!is_bf16()) {
      cpu::linear_forward(S.q.data(), h1, p + o.wq, N, C, QD);
      cpu::linear_forward(S.k.data(), h1, p + o.wk, N, C, KVD);
      cpu::linear_forward(S.v.data(), h1, p + o.wv, N, C, KVD);
      rope_forward(S.q.data(), A.rope, B, T_, m.n_heads, m.head_dim);
      rope_forward(S.k.data(), A.rope, B, T_, m.n_kv_heads, m.head_dim);
      attention_forward_blocked(S.att.data(), S.lse.data(), S.q.data(), S.k.data(), S.v.data(), B, T_, m.n_heads,
                                m.n_kv_heads, m.head_dim);
      cpu::linear_forward(A.tmp.data(), S.att.data(), p + o.wo, N, QD, C);
    }
    T* xmid = is_bf16() ? A.xmid.data() : S.xmid.data();
    add(xmid, x, A.tmp.data(), size_t(N) * C);
  }
  const T* xmid = is_bf16() ? A.xmid.data() : S.xmid.data();
  {
    ScopedTimer t(&times_.router_dispatch);
    const T* h2 = A.hn.data();  // [N,C], recomputed in backward
    rmsnorm_forward(A.hn.data(), S.rstd2.data(), xmid, p + o.moe_norm, N, C, m.norm_eps);
    cpu::linear_forward(A.rlogits.data(), h2, p + o.router, N, C, E);
    router_forward(S.probs.data(), S.rlse.data(), S.topk_idx.data(), S.topk_w.data(), A.rlogits.data(), N, E, K);
    S.losses = router_losses(S.probs.data(), S.rlse.data(), S.topk_idx.data(), N, E, K, m.aux_loss_coef, m.z_loss_coef);
    build_routing(S.routing, S.topk_idx.data(), N, E, K);
    // Each row's combine weight, for the fused dispatch-experts-combine.
    const int32_t* slot_row = S.routing.slot_row.data();
    for (size_t i = 0; i < size_t(N) * K; ++i) A.wrow[slot_row[i]] = S.topk_w[i];
  }
  {
    ScopedTimer t(&times_.experts);  // dispatch, experts and combine in one, into tmp
    if constexpr (kFloat<T>)
      if (is_bf16()) {
        to_bf16(A.in16.data(), A.hn.data(), size_t(N) * C);
        expert_mlp_forward_bf16(A.tmp.data(), S.ab.data(), A.expert_chunk, A.in16.data(),
                                S.routing.row_token.data(), A.wrow.data(), w16.at(o.w1), w16.at(o.w3), w16.at(o.w2),
                                S.routing.offsets.data(), N, E, C, H);
      }
    if (!is_bf16())
      expert_mlp_forward_fused(A.tmp.data(), S.a.data(), S.b.data(), A.expert_chunk32, A.hn.data(),
                               S.routing.row_token.data(), A.wrow.data(), p + o.w1, p + o.w3, p + o.w2,
                               S.routing.offsets.data(), N, E, C, H);
  }
  T* x_next = A.x[l + 1].data();
  add(x_next, xmid, A.tmp.data(), size_t(N) * C);
}

// Final norm, LM head and cross-entropy, in chunks of rows so the [N,V] logits never exist
// whole: each chunk's logits become its gradient in place, which feeds the head's weight
// gradient and the chunk's d(final norm output) before the next chunk reuses the buffer.
template <typename T>
double Model<T>::head_and_loss(const int32_t* targets, int B, bool backward, double loss_scale) {
  ScopedTimer timer(&times_.head_loss);
  Activations& A = *act_;
  const int N = B * cfg_.seq_len, C = cfg_.dim, V = cfg_.vocab_size, L = cfg_.n_layers;
  const T* w_head = params_.data() + A.head_offset;
  T* dw_head = grads_.data() + A.head_offset;
  T* hf = A.tmp.data();  // final norm output [N,C]
  rmsnorm_forward(hf, A.rstdf.data(), A.x[L].data(), params_.data() + A.final_norm_offset, N, C,
                  cfg_.norm_eps);
  const bf16* w16_head = A.head16.data();
  if constexpr (kFloat<T>)
    if (is_bf16()) to_bf16(A.in16.data(), hf, size_t(N) * C);
  if (backward) std::fill(A.dh.begin(), A.dh.begin() + size_t(N) * C, T(0));
  double ce_sum = 0.0;
  for (int r0 = 0; r0 < N; r0 += Activations::kHeadChunk) {
    const int n = std::min(Activations::kHeadChunk, N - r0);
    const T* h = hf + size_t(r0) * C;
    const bf16* h16 = is_bf16() ? A.in16.data() + size_t(r0) * C : nullptr;
    if constexpr (kFloat<T>)
      if (is_bf16()) linear_forward_bf16(A.logits, h16, w16_head, n, C, V);
    if (!is_bf16()) cpu::linear_forward(A.logits, h, w_head, n, C, V);
    ce_sum += cross_entropy_forward(A.logits_lse.data(), A.logits, targets + r0, n, V);
    if (!backward) continue;
    cross_entropy_backward(A.logits, A.logits, A.logits_lse.data(), targets + r0, n, V,
                           T(loss_scale / N));
    if constexpr (kFloat<T>)
      if (is_bf16()) {
        to_bf16(A.logits16.data(), A.logits, size_t(n) * V);
        linear_backward_bf16(A.dh.data() + size_t(r0) * C, dw_head, A.logits16.data(), h16, w16_head, n, C, V);
      }
    if (!is_bf16()) cpu::linear_backward(A.dh.data() + size_t(r0) * C, dw_head, A.logits, h, w_head, n, C, V);
  }
  if (backward) {
    std::fill(A.dx.begin(), A.dx.begin() + size_t(N) * C, T(0));
    rmsnorm_backward(A.dx.data(), grads_.data() + A.final_norm_offset, A.dh.data(), A.x[L].data(), A.rstdf.data(),
                     params_.data() + A.final_norm_offset, N, C);
  }
  return ce_sum;
}

// The forward of one block in reverse. On entry A.dx holds d(block output); on exit d(block input).
template <typename T>
void Model<T>::backward_block(int l, int B, double loss_scale) {
  Activations& A = *act_;
  typename Activations::Layer& S = A.layers[l];
  const LayerOffsets& o = A.offsets[l];
  const ModelConfig& m = cfg_;
  const auto [T_, N, C, E, K, H, QD, KVD] = block_dims(m, B);
  const T* p = params_.data();
  const BlockWeights16 w16 = is_bf16() ? block_weights16(l) : BlockWeights16{nullptr, 0};
  T* g = grads_.data();
  const size_t NC = size_t(N) * C;
  const T* xmid = S.xmid.data();
  if constexpr (kFloat<T>)
    if (is_bf16()) {  // xmid = x + wo(att), exactly as in forward
      ScopedTimer t(&times_.attention);
      linear_forward_bf16(A.tmp.data(), S.att16.data(), w16.at(o.wo), N, QD, C);
      const T* x = A.x[l].data();
      add(A.xmid.data(), x, A.tmp.data(), NC);
      xmid = A.xmid.data();
    }
  {  // x_next = xmid + combine(experts(dispatch(h2)))
    ScopedTimer t(&times_.router_dispatch);
    // Each row's combine weight; the weight gradient comes back from the expert backward.
    const int32_t* slot_row = S.routing.slot_row.data();
    for (size_t i = 0; i < size_t(N) * K; ++i) A.wrow[slot_row[i]] = S.topk_w[i];
    // h2 = rmsnorm(xmid) is recomputed rather than kept.
    rmsnorm_forward(A.hn.data(), S.rstd2.data(), xmid, p + o.moe_norm, N, C, m.norm_eps);
  }
  {
    ScopedTimer t(&times_.experts);  // d(expert inputs) go straight to their tokens in dh
    std::fill(A.dh.begin(), A.dh.begin() + NC, T(0));
    if constexpr (kFloat<T>)
      if (is_bf16()) {
        to_bf16(A.in16.data(), A.hn.data(), NC);
        to_bf16(A.dout16.data(), A.dx.data(), NC);
        expert_mlp_backward_bf16(A.dh.data(), g + o.w1, g + o.w3, g + o.w2, A.dwrow.data(), A.expert_chunk,
                                 A.dout16.data(), A.in16.data(), S.routing.row_token.data(), A.wrow.data(),
                                 S.ab.data(), w16.at(o.w1), w16.at(o.w3), w16.at(o.w2),
                                 S.routing.offsets.data(), E, C, H);
      }
    if (!is_bf16())
      expert_mlp_backward_fused(A.dh.data(), g + o.w1, g + o.w3, g + o.w2, A.dwrow.data(), A.expert_chunk32,
                                A.dx.data(), A.hn.data(), S.routing.row_token.data(), A.wrow.data(), S.a.data(),
                                S.b.data(), p + o.w1, p + o.w3, p + o.w2, S.routing.offsets.data(), E, C, H);
    const int32_t* slot_row = S.routing.slot_row.data();
    for (size_t i = 0; i < size_t(N) * K; ++i) A.dtopk_w[i] = A.dwrow[slot_row[i]];
  }
  {
    ScopedTimer t(&times_.router_dispatch);
    router_backward(A.drlogits.data(), A.dtopk_w.data(), S.probs.data(), S.rlse.data(), S.topk_idx.data(),
                    S.topk_w.data(), N, E, K, m.aux_loss_coef, m.z_loss_coef, loss_scale);
    cpu::linear_backward(A.dh.data(), g + o.router, A.drlogits.data(), A.hn.data(), p + o.router, N, C, E);
    rmsnorm_backward(A.dx.data(), g + o.moe_norm, A.dh.data(), xmid, S.rstd2.data(), p + o.moe_norm, N, C);
  }
  // xmid = x + wo(attention(rope(h1 wq), rope(h1 wk), h1 wv)), h1 = rmsnorm(x)
  ScopedTimer t(&times_.attention);
  std::fill(A.datt, A.datt + size_t(N) * QD, T(0));
  if constexpr (kFloat<T>)
    if (is_bf16()) {
      to_bf16(A.dout16.data(), A.dx.data(), NC);
      linear_backward_bf16(A.datt, g + o.wo, A.dout16.data(), S.att16.data(), w16.at(o.wo), N, QD, C);
      to_bf16(A.dout16.data(), A.datt, size_t(N) * QD);
      attention_backward_blocked_bf16(A.dq, A.dk, A.dv, A.dout16.data(), S.att16.data(), S.lse.data(), S.q16.data(),
                                      S.k16.data(), S.v16.data(), B, T_, m.n_heads, m.n_kv_heads, m.head_dim);
    }
  if (!is_bf16()) {
    cpu::linear_backward(A.datt, g + o.wo, A.dx.data(), S.att.data(), p + o.wo, N, QD, C);
    attention_backward_blocked(A.dq, A.dk, A.dv, A.datt, S.att.data(), S.lse.data(), S.q.data(), S.k.data(),
                               S.v.data(), B, T_, m.n_heads, m.n_kv_heads, m.head_dim);
  }
  rope_backward(A.dq, A.rope, B, T_, m.n_heads, m.head_dim);
  rope_backward(A.dk, A.rope, B, T_, m.n_kv_heads, m.head_dim);
  std::fill(A.dh.begin(), A.dh.begin() + NC, T(0));
  T* h1 = A.hn.data();  // recomputed: rmsnorm(x) as in forward
  rmsnorm_forward(h1, S.rstd1.data(), A.x[l].data(), p + o.attn_norm, N, C, m.norm_eps);
  if constexpr (kFloat<T>)
    if (is_bf16()) {
      to_bf16(A.in16.data(), h1, NC);
      const struct { const T* d; size_t w; int out; } proj[] = {{A.dq, o.wq, QD}, {A.dk, o.wk, KVD},
                                                                {A.dv, o.wv, KVD}};
      for (const auto& pr : proj) {
        to_bf16(A.dout16.data(), pr.d, size_t(N) * pr.out);
        linear_backward_bf16(A.dh.data(), g + pr.w, A.dout16.data(), A.in16.data(), w16.at(pr.w), N, C, pr.out);
      }
    }
  if (!is_bf16()) {
    cpu::linear_backward(A.dh.data(), g + o.wq, A.dq, h1, p + o.wq, N, C, QD);
    cpu::linear_backward(A.dh.data(), g + o.wk, A.dk, h1, p + o.wk, N, C, KVD);
    cpu::linear_backward(A.dh.data(), g + o.wv, A.dv, h1, p + o.wv, N, C, KVD);
  }
  rmsnorm_backward(A.dx.data(), g + o.attn_norm, A.dh.data(), A.x[l].data(), S.rstd1.data(), p + o.attn_norm, N, C);
}

double flops_per_token(const ModelConfig& m) {
  const double C = m.dim, QD = double(m.n_heads) * m.head_dim, KVD = double(m.n_kv_heads) * m.head_dim;
  const double attn = 2 * C * QD + 2 * C * KVD;
  const double active = m.n_layers * (attn + C * m.n_experts + m.top_k * 3.0 * C * m.expert_hidden);
  return 6.0 * (active + double(m.vocab_size) * C) + 12.0 * m.n_layers * m.seq_len * QD;
}

template class Model<float>;
template class Model<double>;

}  // namespace atl
