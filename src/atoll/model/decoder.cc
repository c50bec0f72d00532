#include "atoll/model/decoder.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "atoll/core/check.h"
#include "atoll/layers/embedding.h"
#include "atoll/backend/cpu/linear.h"
#include "atoll/layers/rmsnorm.h"
#include "atoll/layers/router.h"
#include "atoll/layers/swiglu.h"

namespace atl {

Decoder::Decoder(const ModelConfig& m, const float* params, int max_len)
    : m_(m), layout_(ParamLayout::build(m)), p_(params), max_len_(max_len),
      rope_(RopeTable<float>::build(max_len, m.head_dim, m.rope_theta)) {
  const size_t QD = size_t(m.n_heads) * m.head_dim, KVD = size_t(m.n_kv_heads) * m.head_dim;
  k_cache_.assign(m.n_layers, std::vector<float>(size_t(max_len) * KVD));
  v_cache_.assign(m.n_layers, std::vector<float>(size_t(max_len) * KVD));
  x_.resize(m.dim), h_.resize(m.dim), q_.resize(QD), att_.resize(QD), tmp_.resize(m.dim);
  rl_.resize(m.n_experts), probs_.resize(m.n_experts), w_.resize(m.top_k), idx_.resize(m.top_k);
  a_.resize(m.expert_hidden), b_.resize(m.expert_hidden), g_.resize(m.expert_hidden), y_.resize(m.dim);
  logits_.resize(m.vocab_size);
}

const std::vector<float>& Decoder::step(int32_t token) {
  ATOLL_CHECK_LT(pos_, max_len_) << "decoder cache is full";
  const int C = m_.dim;
  embedding_forward(x_.data(), &token, p_ + layout_.at("embed").offset, 1, C, m_.vocab_size);
  for (int l = 0; l < m_.n_layers; ++l) {
    attend(l);
    moe(l);
  }
  rmsnorm_forward(h_.data(), &rstd_, x_.data(), p_ + layout_.at("final_norm").offset, 1, C, m_.norm_eps);
  cpu::linear_forward(logits_.data(), h_.data(), p_ + layout_.at(m_.tie_embeddings ? "embed" : "head").offset, 1, C,
                 m_.vocab_size);
  ++pos_;
  return logits_;
}

void Decoder::attend(int l) {
  const std::string pre = "layers." + std::to_string(l) + ".";
  const int C = m_.dim, HD = m_.head_dim, NH = m_.n_heads, NKV = m_.n_kv_heads;
  const int QD = NH * HD, KVD = NKV * HD;
  float* kc = k_cache_[l].data() + size_t(pos_) * KVD;
  float* vc = v_cache_[l].data() + size_t(pos_) * KVD;
  rmsnorm_forward(h_.data(), &rstd_, x_.data(), p_ + layout_.at(pre + "attn_norm").offset, 1, C, m_.norm_eps);
  cpu::linear_forward(q_.data(), h_.data(), p_ + layout_.at(pre + "attn.wq").offset, 1, C, QD);
  cpu::linear_forward(kc, h_.data(), p_ + layout_.at(pre + "attn.wk").offset, 1, C, KVD);
  cpu::linear_forward(vc, h_.data(), p_ + layout_.at(pre + "attn.wv").offset, 1, C, KVD);
  rope_forward(q_.data(), rope_, 1, 1, NH, HD, pos_);
  rope_forward(kc, rope_, 1, 1, NKV, HD, pos_);
  const float scale = 1.0f / std::sqrt(float(HD));
  std::vector<float> score(pos_ + 1);
  for (int h = 0; h < NH; ++h) {
    const int kh = h / (NH / NKV);
    const float* q = q_.data() + size_t(h) * HD;
    float mx = -INFINITY;
    for (int s = 0; s <= pos_; ++s) {
      const float* k = k_cache_[l].data() + size_t(s) * KVD + size_t(kh) * HD;
      score[s] = std::inner_product(q, q + HD, k, 0.0f) * scale;
      mx = std::max(mx, score[s]);
    }
    float sum = 0;
    for (auto& s : score) sum += (s = std::exp(s - mx));
    float* o = att_.data() + size_t(h) * HD;
    std::fill(o, o + HD, 0.0f);
    for (int s = 0; s <= pos_; ++s) {
      const float* v = v_cache_[l].data() + size_t(s) * KVD + size_t(kh) * HD;
      for (int d = 0; d < HD; ++d) o[d] += score[s] / sum * v[d];
    }
  }
  cpu::linear_forward(tmp_.data(), att_.data(), p_ + layout_.at(pre + "attn.wo").offset, 1, QD, C);
  for (int c = 0; c < C; ++c) x_[c] += tmp_[c];
}

void Decoder::moe(int l) {
  const std::string pre = "layers." + std::to_string(l) + ".";
  const int C = m_.dim, E = m_.n_experts, K = m_.top_k, H = m_.expert_hidden;
  rmsnorm_forward(h_.data(), &rstd_, x_.data(), p_ + layout_.at(pre + "moe_norm").offset, 1, C, m_.norm_eps);
  cpu::linear_forward(rl_.data(), h_.data(), p_ + layout_.at(pre + "moe.router").offset, 1, C, E);
  router_forward(probs_.data(), &lse_, idx_.data(), w_.data(), rl_.data(), 1, E, K);
  const size_t WH = size_t(H) * C;
  const float* w1 = p_ + layout_.at(pre + "moe.w1").offset;
  const float* w3 = p_ + layout_.at(pre + "moe.w3").offset;
  const float* w2 = p_ + layout_.at(pre + "moe.w2").offset;
  for (int j = 0; j < K; ++j) {
    const size_t e = size_t(idx_[j]);
    cpu::linear_forward(a_.data(), h_.data(), w1 + e * WH, 1, C, H);
    cpu::linear_forward(b_.data(), h_.data(), w3 + e * WH, 1, C, H);
    swiglu_forward(g_.data(), a_.data(), b_.data(), size_t(H));
    cpu::linear_forward(y_.data(), g_.data(), w2 + e * WH, 1, H, C);
    for (int c = 0; c < C; ++c) x_[c] += w_[j] * y_[c];
  }
}

int32_t sample_token(const std::vector<float>& logits, const SampleOptions& opts, Rng& rng) {
  const int V = int(logits.size());
  if (opts.temperature <= 0) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(V);
  double sum = 0;
  for (int v = 0; v < V; ++v) sum += (p[v] = std::exp((logits[v] - mx) / opts.temperature));
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  // Keep the most probable tokens until their mass reaches top_p, then draw among them.
  double kept = 0;
  int n = 0;
  while (n < V && (n == 0 || kept < opts.top_p * sum)) kept += p[order[n++]];
  double u = rng.uniform() * kept;
  for (int i = 0; i < n; ++i)
    if ((u -= p[order[i]]) <= 0) return order[i];
  return order[n - 1];
}

}  // namespace atl
