#include "atoll/model/model.h"

#include <algorithm>
#include <cstring>

#include "atoll/core/check.h"
#include "atoll/core/rng.h"
#include "atoll/core/timer.h"
#include "atoll/backend/cpu/attention.h"
#include "atoll/layers/cross_entropy.h"
#include "atoll/layers/embedding.h"
#include "atoll/layers/expert_mlp.h"
#include "atoll/layers/linear.h"
#include "atoll/layers/moe_dispatch.h"
#include "atoll/layers/rmsnorm.h"
#include "atoll/layers/rope.h"
#include "atoll/layers/router.h"
#include "atoll/model/model_buffers.h"

namespace atl {

template <typename T>
Model<T>::Model(const ModelConfig& cfg, int max_batch)
    : cfg_(cfg), layout_(ParamLayout::build(cfg)), max_batch_(max_batch) {
  ATOLL_CHECK_GE(max_batch, 1);
  params_.assign(layout_.total(), T(0));
  grads_.assign(layout_.total(), T(0));
  act_ = std::make_unique<Activations>(cfg, max_batch);
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

namespace {
// The sizes one block works with, for B sequences (see the legend in config.h).
struct BlockDims {
  int T, N, C, E, K, H, QD, KVD;
};
BlockDims block_dims(const ModelConfig& m, int B) {
  return {m.seq_len, B * m.seq_len, m.dim, m.n_experts, m.top_k, m.expert_hidden, m.n_heads * m.head_dim,
          m.n_kv_heads * m.head_dim};
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
  {
    ScopedTimer t(&times_.attention);
    rmsnorm_forward(S.h1.data(), S.rstd1.data(), x, p + o.attn_norm, N, C, m.norm_eps);
    linear_forward(S.q.data(), S.h1.data(), p + o.wq, N, C, QD);
    linear_forward(S.k.data(), S.h1.data(), p + o.wk, N, C, KVD);
    linear_forward(S.v.data(), S.h1.data(), p + o.wv, N, C, KVD);
    rope_forward(S.q.data(), A.rope, B, T_, m.n_heads, m.head_dim);
    rope_forward(S.k.data(), A.rope, B, T_, m.n_kv_heads, m.head_dim);
    attention_forward_blocked(S.att.data(), S.lse.data(), S.q.data(), S.k.data(), S.v.data(), B, T_, m.n_heads, m.n_kv_heads,
                      m.head_dim);
    linear_forward(A.tmp.data(), S.att.data(), p + o.wo, N, QD, C);
    for (size_t i = 0; i < size_t(N) * C; ++i) S.xmid[i] = x[i] + A.tmp[i];
  }
  {
    ScopedTimer t(&times_.router_dispatch);
    rmsnorm_forward(S.h2.data(), S.rstd2.data(), S.xmid.data(), p + o.moe_norm, N, C, m.norm_eps);
    linear_forward(A.rlogits.data(), S.h2.data(), p + o.router, N, C, E);
    router_forward(S.probs.data(), S.rlse.data(), S.topk_idx.data(), S.topk_w.data(), A.rlogits.data(), N, E, K);
    S.losses = router_losses(S.probs.data(), S.rlse.data(), S.topk_idx.data(), N, E, K, m.aux_loss_coef, m.z_loss_coef);
    build_routing(S.routing, S.topk_idx.data(), N, E, K);
    dispatch_forward(A.xe.data(), S.h2.data(), S.routing, N, C, K);
  }
  {
    ScopedTimer t(&times_.experts);
    expert_mlp_forward(S.ye.data(), S.a.data(), S.b.data(), A.g.data(), A.xe.data(), p + o.w1, p + o.w3, p + o.w2,
                       S.routing.offsets.data(), E, C, H);
  }
  ScopedTimer t(&times_.router_dispatch);
  combine_forward(A.tmp.data(), S.ye.data(), S.topk_w.data(), S.routing, N, C, K);
  T* x_next = A.x[l + 1].data();
  for (size_t i = 0; i < size_t(N) * C; ++i) x_next[i] = S.xmid[i] + A.tmp[i];
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
  rmsnorm_forward(A.hf.data(), A.rstdf.data(), A.x[L].data(), params_.data() + A.final_norm_offset, N, C,
                  cfg_.norm_eps);
  if (backward) std::fill(A.dh.begin(), A.dh.begin() + size_t(N) * C, T(0));
  double ce_sum = 0.0;
  for (int r0 = 0; r0 < N; r0 += Activations::kHeadChunk) {
    const int n = std::min(Activations::kHeadChunk, N - r0);
    const T* h = A.hf.data() + size_t(r0) * C;
    linear_forward(A.logits.data(), h, w_head, n, C, V);
    ce_sum += cross_entropy_forward(A.logits_lse.data(), A.logits.data(), targets + r0, n, V);
    if (!backward) continue;
    cross_entropy_backward(A.logits.data(), A.logits.data(), A.logits_lse.data(), targets + r0, n, V,
                           T(loss_scale / N));
    linear_backward(A.dh.data() + size_t(r0) * C, dw_head, A.logits.data(), h, w_head, n, C, V);
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
  T* g = grads_.data();
  const size_t NC = size_t(N) * C;
  {  // x_next = xmid + combine(experts(dispatch(h2)))
    ScopedTimer t(&times_.router_dispatch);
    combine_backward(A.dye.data(), A.dtopk_w.data(), A.dx.data(), S.ye.data(), S.topk_w.data(), S.routing, N, C, K);
    dispatch_forward(A.xe.data(), S.h2.data(), S.routing, N, C, K);  // re-gathered rather than kept
  }
  {
    ScopedTimer t(&times_.experts);
    expert_mlp_backward(A.dxe.data(), g + o.w1, g + o.w3, g + o.w2, A.g.data(), A.da.data(), A.db.data(),
                        A.dye.data(), S.a.data(), S.b.data(), A.xe.data(), p + o.w1, p + o.w3, p + o.w2,
                        S.routing.offsets.data(), E, C, H);
  }
  {
    ScopedTimer t(&times_.router_dispatch);
    std::fill(A.dh.begin(), A.dh.begin() + NC, T(0));
    dispatch_backward(A.dh.data(), A.dxe.data(), S.routing, N, C, K);
    router_backward(A.drlogits.data(), A.dtopk_w.data(), S.probs.data(), S.rlse.data(), S.topk_idx.data(),
                    S.topk_w.data(), N, E, K, m.aux_loss_coef, m.z_loss_coef, loss_scale);
    linear_backward(A.dh.data(), g + o.router, A.drlogits.data(), S.h2.data(), p + o.router, N, C, E);
    rmsnorm_backward(A.dx.data(), g + o.moe_norm, A.dh.data(), S.xmid.data(), S.rstd2.data(), p + o.moe_norm, N, C);
  }
  // xmid = x + wo(attention(rope(h1 wq), rope(h1 wk), h1 wv)), h1 = rmsnorm(x)
  ScopedTimer t(&times_.attention);
  std::fill(A.datt.begin(), A.datt.begin() + size_t(N) * QD, T(0));
  linear_backward(A.datt.data(), g + o.wo, A.dx.data(), S.att.data(), p + o.wo, N, QD, C);
  attention_backward_blocked(A.dq.data(), A.dk.data(), A.dv.data(), A.datt.data(), S.att.data(), S.lse.data(), S.q.data(),
                     S.k.data(), S.v.data(), B, T_, m.n_heads, m.n_kv_heads, m.head_dim);
  rope_backward(A.dq.data(), A.rope, B, T_, m.n_heads, m.head_dim);
  rope_backward(A.dk.data(), A.rope, B, T_, m.n_kv_heads, m.head_dim);
  std::fill(A.dh.begin(), A.dh.begin() + NC, T(0));
  linear_backward(A.dh.data(), g + o.wq, A.dq.data(), S.h1.data(), p + o.wq, N, C, QD);
  linear_backward(A.dh.data(), g + o.wk, A.dk.data(), S.h1.data(), p + o.wk, N, C, KVD);
  linear_backward(A.dh.data(), g + o.wv, A.dv.data(), S.h1.data(), p + o.wv, N, C, KVD);
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
