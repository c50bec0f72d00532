// Grouped-query causal attention with RoPE (Mixtral's): NH query heads, NKV key/value heads
// each shared by NH/NKV query heads, scale 1/sqrt(HD), rotate-half RoPE on q and k.
//   out = wo · attention(rope(h wqᵀ), rope(h wkᵀ), h wvᵀ)
// Rows "layers.{l}.attn.{wq,wk,wv,wo}"; keeps q, k, v (after RoPE) and the attention output
// (in bf16 under bf16 products) and each row's log-sum-exp; decodes with a KV cache.
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
  size_t work_elements() const override;  // dq, dk, dv, d(att): [N, 2 QD + 2 KVD]
  void forward(T* out, const T* h, const PartContext<T>& c) override;
  void recompute_output(T* out, const PartContext<T>& c) override;
  void backward(T* dh, const T* dout, const T* h, const PartContext<T>& c) override;
  void start_decode(int max_len) override;
  void decode(T* out, const T* h, int pos, const PartContext<T>& c) override;

 private:
  ModelConfig m_;
  int layer_, max_tokens_;
  size_t wq_, wk_, wv_, wo_;
  std::shared_ptr<AttentionScratch<T>> sh_;  // shared by the attention layers
  Kept<T> q_, k_, v_, att_;                 // [N,QD], [N,KVD] x2, [N,QD]
  std::vector<T> lse_;                      // [B,NH,T] log-sum-exp of each row of scores
  std::vector<T> k_cache_, v_cache_;        // decoding: [max_len, KVD] each
  std::vector<T> dec_q_, dec_att_, score_;  // decoding: [QD], [QD], [max_len]
};

}  // namespace atl
