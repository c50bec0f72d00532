// Activation buffers of Model<T>, sized once for max_batch sequences (private to model.cc).
// What each block keeps for its backward pass is listed in Layer; everything else is scratch
// shared by all blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "atoll/layers/moe_dispatch.h"
#include "atoll/layers/rope.h"
#include "atoll/layers/router.h"
#include "atoll/model/model.h"

namespace atl {

// Offsets of one block's tensors in the flat buffers, read once from the layout table.
struct LayerOffsets {
  size_t attn_norm, wq, wk, wv, wo, moe_norm, router, w1, w3, w2;
};

template <typename T>
struct Model<T>::Activations {
  static constexpr int kHeadChunk = 256;  // rows of logits alive at once

  struct Layer {
    std::vector<T> h1, rstd1;       // attention norm out [N,C], [N]
    std::vector<T> q, k, v;         // after RoPE [N,NH*HD], [N,NKV*HD], [N,NKV*HD]
    std::vector<T> att, lse;        // attention out [N,NH*HD], row log-sum-exp [B,NH,T]
    std::vector<T> xmid;            // residual after attention [N,C]
    std::vector<T> h2, rstd2;       // MoE norm out [N,C], [N]
    std::vector<T> probs, rlse;     // router probabilities [N,E], logsumexp [N]
    std::vector<int32_t> topk_idx;  // [N,K]
    std::vector<T> topk_w;          // [N,K]
    std::vector<T> a, b;            // expert pre-activations [R,H]
    std::vector<T> ye;              // expert outputs [R,C]
    ExpertRouting routing;
    RouterLosses losses;
  };

  Activations(const ModelConfig& m, int max_batch) : rope(RopeTable<T>::build(m.seq_len, m.head_dim, m.rope_theta)) {
    const size_t N = size_t(max_batch) * m.seq_len, C = m.dim, E = m.n_experts, K = m.top_k, H = m.expert_hidden;
    const size_t QD = size_t(m.n_heads) * m.head_dim, KVD = size_t(m.n_kv_heads) * m.head_dim, R = N * K;
    const ParamLayout layout = ParamLayout::build(m);
    x.assign(m.n_layers + 1, std::vector<T>(N * C));
    layers.resize(m.n_layers);
    for (int l = 0; l < m.n_layers; ++l) {
      Layer& s = layers[l];
      s.h1.resize(N * C), s.rstd1.resize(N), s.q.resize(N * QD), s.k.resize(N * KVD), s.v.resize(N * KVD);
      s.att.resize(N * QD), s.lse.resize(size_t(max_batch) * m.n_heads * m.seq_len), s.xmid.resize(N * C);
      s.h2.resize(N * C), s.rstd2.resize(N), s.probs.resize(N * E), s.rlse.resize(N);
      s.topk_idx.resize(N * K), s.topk_w.resize(N * K), s.a.resize(R * H), s.b.resize(R * H), s.ye.resize(R * C);
      const std::string pre = "layers." + std::to_string(l) + ".";
      auto off = [&](const char* name) { return layout.at(pre + name).offset; };
      offsets.push_back({off("attn_norm"), off("attn.wq"), off("attn.wk"), off("attn.wv"), off("attn.wo"),
                         off("moe_norm"), off("moe.router"), off("moe.w1"), off("moe.w3"), off("moe.w2")});
    }
    hf.resize(N * C), rstdf.resize(N), tokens.resize(N);
    tmp.resize(N * C), xe.resize(R * C), g.resize(R * H), da.resize(R * H), db.resize(R * H);
    dye.resize(R * C), dxe.resize(R * C), dtopk_w.resize(N * K), rlogits.resize(N * E), drlogits.resize(N * E);
    dx.resize(N * C), dh.resize(N * C), dq.resize(N * QD), dk.resize(N * KVD), dv.resize(N * KVD), datt.resize(N * QD);
    logits.resize(size_t(kHeadChunk) * m.vocab_size), logits_lse.resize(kHeadChunk);
    final_norm_offset = layout.at("final_norm").offset;
    head_offset = layout.at(m.tie_embeddings ? "embed" : "head").offset;
  }

  RopeTable<T> rope;
  std::vector<std::vector<T>> x;  // [L+1][N,C] residual stream entering each block (x[L]: final norm input)
  std::vector<Layer> layers;
  std::vector<LayerOffsets> offsets;
  std::vector<T> hf, rstdf;            // final norm out [N,C], [N]
  std::vector<int32_t> tokens;         // [N] inputs, for the embedding backward
  std::vector<T> tmp, xe, g, da, db;   // scratch [N,C], [R,C], [R,H] x3
  std::vector<T> dye, dxe, dtopk_w;    // [R,C], [R,C], [N,K]
  std::vector<T> rlogits, drlogits;    // [N,E]
  std::vector<T> dx, dh, dq, dk, dv, datt;
  std::vector<T> logits, logits_lse;   // [chunk,V], [chunk]
  size_t final_norm_offset = 0, head_offset = 0;
};

}  // namespace atl
