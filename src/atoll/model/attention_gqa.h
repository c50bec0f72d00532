// Grouped-query causal attention with RoPE (Mixtral's): NH query heads, NKV key/value heads
// each shared by NH/NKV query heads, scale 1/sqrt(HD), rotate-half RoPE on q and k.
//   out = wo · attention(rope(norm_q(h wqᵀ)), rope(norm_k(h wkᵀ)), h wvᵀ)
// norm_q, norm_k are the identity, or with model.qk_norm an RMSNorm (epsilon model.norm_eps) over
// each head's HD entries with one gain [HD] ("head", Qwen3-MoE) or over the whole projection with
// a gain [QD] / [KVD] ("proj", OLMoE). With model.qkv_bias the q, k and v projections add a
// bias (Qwen2-MoE's), before the q/k norm.
// Rows "layers.{l}.attn.{wq,wk,wv,wo}", then with q/k/v bias "attn.{bq,bk,bv}", then with q/k
// norm "attn.q_norm", "attn.k_norm"; keeps q,
// k, v (after RoPE) and the attention output (in bf16 under bf16 products) and each row's
// log-sum-exp, and with q/k norm the projections before it and their 1/rms; decodes with a KV cache.
#pragma once

#include <memory>
#include <vector>

#include "atoll/layers/rope.h"
#include "atoll/model/attention_core.h"
#include "atoll/model/part.h"

namespace atl {

void attention_gqa_rows(ParamLayout& layout, const ModelConfig& m, int layer);

template <typename T>
class AttentionGqa final : public AttentionPart<T> {
 public:
  AttentionGqa(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s, PartScratch& scratch);
  size_t work_elements() const override;  // dq, dk, dv, d(att) [N, 2 QD + 2 KVD]; q/k norm: + dk [N, KVD]
  void forward(T* out, const T* h, const PartContext<T>& c) override;
  void recompute_output(T* out, const PartContext<T>& c) override;
  void backward(T* dh, const T* dout, const T* h, const PartContext<T>& c) override;
  void start_decode(int max_len, int cache_rows) override;
  void decode(T* out, const T* h, int pos, const PartContext<T>& c) override;
  void prefill(T* out, const T* h, int pos, const PartContext<T>& c) override;

 private:
  // q/k norm: the rows of `x` [N, width] normalised in place, each `norm_width()` entries by `gain`;
  // the input kept in raw[N, width], 1/rms in rstd. Backward: dx [N, width] (=) from dy (the
  // gradient of the normed values), the gain's gradient (+=).
  int norm_width(int width) const { return m_.qk_norm == "head" ? m_.head_dim : width; }
  void qk_norm_forward(T* x, std::vector<T>& raw, std::vector<T>& rstd, size_t gain, int N, int width,
                       const PartContext<T>& c);
  void qk_norm_backward(T* dx, const T* dy, const std::vector<T>& raw, const std::vector<T>& rstd, size_t gain, int N,
                        int width, const PartContext<T>& c);

  void add_bias(T* x, size_t bias, int N, int width, const PartContext<T>& c) const;
  void project(T* q, T* k, T* v, const T* h, int N, const PartContext<T>& c);
  void bias_backward(const T* dx, size_t bias, int N, int width, const PartContext<T>& c) const;

  ModelConfig m_;
  int layer_, max_tokens_;
  bool qk_norm_;
  size_t wq_, wk_, wv_, wo_, q_norm_ = 0, k_norm_ = 0, bq_ = 0, bk_ = 0, bv_ = 0;
  std::vector<T> q_raw_, k_raw_, q_rstd_, k_rstd_;  // q/k norm: [N,QD], [N,KVD], one 1/rms per normed row
  std::shared_ptr<AttentionScratch<T>> sh_;  // shared by the attention layers
  Kept<T> q_, k_, v_, att_;                 // [N,QD], [N,KVD] x2, [N,QD]
  std::vector<T> lse_;                      // [B,NH,T] log-sum-exp of each row of scores
  std::vector<T> k_cache_, v_cache_;        // decoding: [max_len, KVD] each
  std::vector<T> dec_q_, dec_att_;  // decoding: [QD], [QD]
  int max_len_ = 0;                 // decoding: positions the cache holds
  std::vector<T> dec_kv_;                   // decoding: [2 KVD] a position another rank caches
};

}  // namespace atl
