// Activation buffers of Model<T>, sized once for max_batch sequences (private to model.cc).
// What each block keeps for its backward pass is listed in Layer; everything else is scratch
// shared by all blocks.
#pragma once

#include <algorithm>
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
  size_t end;  // one past the block's last parameter: its tensors are [attn_norm, end)
};

template <typename T>
struct Model<T>::Activations {
  static constexpr int kHeadChunk = 256;  // rows of logits alive at once

  struct Layer {
    std::vector<T> rstd1;           // attention norm [N] (its output is recomputed in backward)
    std::vector<T> q, k, v;         // after RoPE [N,NH*HD], [N,NKV*HD], [N,NKV*HD]
    std::vector<T> att, lse;        // attention out [N,NH*HD], row log-sum-exp [B,NH,T]
    std::vector<T> xmid;            // residual after attention [N,C]
    std::vector<T> rstd2;           // MoE norm [N] (its output is recomputed in backward)
    std::vector<T> probs, rlse;     // router probabilities [N,E], logsumexp [N]
    std::vector<int32_t> topk_idx;  // [N,K]
    std::vector<T> topk_w;          // [N,K]
    std::vector<T> a, b;            // expert pre-activations [R,H] (fp32 products)
    std::vector<bf16> ab, bb;       // the same in bf16 (bf16 products)
    std::vector<T> ye;              // expert outputs [R,C]
    ExpertRouting routing;
    RouterLosses losses;
  };

  Activations(const ModelConfig& m, int max_batch, bool use_bf16) : rope(RopeTable<T>::build(m.seq_len, m.head_dim, m.rope_theta)) {
    const size_t N = size_t(max_batch) * m.seq_len, C = m.dim, E = m.n_experts, K = m.top_k, H = m.expert_hidden;
    const size_t QD = size_t(m.n_heads) * m.head_dim, KVD = size_t(m.n_kv_heads) * m.head_dim, R = N * K;
    const ParamLayout layout = ParamLayout::build(m);
    x.assign(m.n_layers + 1, std::vector<T>(N * C));
    layers.resize(m.n_layers);
    for (int l = 0; l < m.n_layers; ++l) {
      Layer& s = layers[l];
      s.rstd1.resize(N), s.q.resize(N * QD), s.k.resize(N * KVD), s.v.resize(N * KVD);
      s.att.resize(N * QD), s.lse.resize(size_t(max_batch) * m.n_heads * m.seq_len), s.xmid.resize(N * C);
      s.rstd2.resize(N), s.probs.resize(N * E), s.rlse.resize(N);
      s.topk_idx.resize(N * K), s.topk_w.resize(N * K), s.ye.resize(R * C);
      if (use_bf16) s.ab.resize(R * H), s.bb.resize(R * H);
      else s.a.resize(R * H), s.b.resize(R * H);
      const std::string pre = "layers." + std::to_string(l) + ".";
      auto off = [&](const char* name) { return layout.at(pre + name).offset; };
      offsets.push_back({off("attn_norm"), off("attn.wq"), off("attn.wk"), off("attn.wv"), off("attn.wo"),
                         off("moe_norm"), off("moe.router"), off("moe.w1"), off("moe.w3"), off("moe.w2"),
                         off("moe.w2") + layout.at(pre + "moe.w2").numel});
      layer_params = std::max(layer_params, offsets.back().end - offsets.back().attn_norm);
    }
    hf.resize(N * C), rstdf.resize(N), tokens.resize(N), hn.resize(N * C);
    tmp.resize(N * C), xe.resize(R * C), g.resize(R * H);
    if (use_bf16) {
      const size_t W = std::max({C, QD, KVD});
      xe16.resize(R * C), g16.resize(R * H), da16.resize(R * H), db16.resize(R * H), dye16.resize(R * C);
      in16.resize(N * W), dout16.resize(N * W), logits16.resize(size_t(kHeadChunk) * m.vocab_size);
      w16.resize(layer_params), head16.resize(size_t(m.vocab_size) * C);
    } else {
      da.resize(R * H), db.resize(R * H);
    }
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
  std::vector<T> tmp, xe, g, da, db;   // scratch [N,C], [R,C], [R,H] x3 (da, db: fp32 products only)
  // Scratch of the bf16 products: dispatched rows [R,C], gate and its gradients [R,H] x3,
  // d(expert out) [R,C], a product's input and output gradient [N, max(C, QD, KVD)] each,
  // d(logits) of one head chunk [chunk, V].
  std::vector<bf16> xe16, g16, da16, db16, dye16, in16, dout16, logits16;
  // bf16 copies of the weights: one block's at a time (w16 holds block w16_block, -1 when
  // stale), converted on entry to its forward and again to its backward unless still held,
  // and the LM head's for the whole step. 27 MB instead of a 235 MB copy of all parameters.
  std::vector<bf16> w16, head16;
  int w16_block = -1;
  size_t layer_params = 0;  // elements of the largest block
  std::vector<T> hn;        // a norm's output [N,C], recomputed in backward rather than kept per block
  std::vector<T> dye, dxe, dtopk_w;    // [R,C], [R,C], [N,K]
  std::vector<T> rlogits, drlogits;    // [N,E]
  std::vector<T> dx, dh, dq, dk, dv, datt;
  std::vector<T> logits, logits_lse;   // [chunk,V], [chunk]
  size_t final_norm_offset = 0, head_offset = 0;
};

}  // namespace atl
