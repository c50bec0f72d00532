// Activation buffers of Model<T>, sized once for max_batch sequences (private to model.cc).
// What each block keeps for its backward pass is listed in Layer; everything else is scratch
// shared by all blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "atoll/backend/cpu/expert_mlp.h"
#include "atoll/backend/cpu/expert_mlp_bf16.h"
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
  static constexpr int kHeadChunk = 256;     // rows of logits alive at once
  static constexpr int kExpertChunk = 2048;  // dispatched rows alive at once in the experts

  struct Layer {
    std::vector<T> rstd1;           // attention norm [N] (its output is recomputed in backward)
    std::vector<T> q, k, v;         // after RoPE [N,NH*HD], [N,NKV*HD], [N,NKV*HD] (fp32 products)
    std::vector<T> att, lse;        // attention out [N,NH*HD] (fp32 products), row log-sum-exp [B,NH,T]
    std::vector<bf16> q16, k16, v16, att16;  // q, k, v, att in bf16 (bf16 products)
    std::vector<T> xmid;            // residual after attention [N,C] (fp32 products; bf16: recomputed)
    std::vector<T> rstd2;           // MoE norm [N] (its output is recomputed in backward)
    std::vector<T> probs, rlse;     // router probabilities [N,E], logsumexp [N]
    std::vector<int32_t> topk_idx;  // [N,K]
    std::vector<T> topk_w;          // [N,K]
    std::vector<T> a, b;            // expert pre-activations [R,H] (fp32 products)
    std::vector<bf16> ab;           // a in bf16 (bf16 products; b is recomputed in backward)
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
      s.rstd1.resize(N), s.lse.resize(size_t(max_batch) * m.n_heads * m.seq_len);
      s.rstd2.resize(N), s.probs.resize(N * E), s.rlse.resize(N);
      s.topk_idx.resize(N * K), s.topk_w.resize(N * K);
      if (use_bf16) {
        s.q16.resize(N * QD), s.k16.resize(N * KVD), s.v16.resize(N * KVD), s.att16.resize(N * QD);
        s.ab.resize((R + kExpertRowPad) * H);
      } else {
        s.q.resize(N * QD), s.k.resize(N * KVD), s.v.resize(N * KVD), s.att.resize(N * QD), s.xmid.resize(N * C);
        s.a.resize(R * H), s.b.resize(R * H);
      }
      const std::string pre = "layers." + std::to_string(l) + ".";
      auto off = [&](const char* name) { return layout.at(pre + name).offset; };
      offsets.push_back({off("attn_norm"), off("attn.wq"), off("attn.wk"), off("attn.wv"), off("attn.wo"),
                         off("moe_norm"), off("moe.router"), off("moe.w1"), off("moe.w3"), off("moe.w2"),
                         off("moe.w2") + layout.at(pre + "moe.w2").numel});
      layer_params = std::max(layer_params, offsets.back().end - offsets.back().attn_norm);
    }
    rstdf.resize(N), tokens.resize(N), hn.resize(N * C);
    tmp.resize(N * C), wrow.resize(R), dwrow.resize(R);
    // g holds the experts' chunk scratch (fp32 products: all of it; bf16: d(gate)); the attention
    // gradients and the head's logits live in the same memory, free while they run.
    const size_t chunk = kExpertChunk;
    const size_t expert_scratch = use_bf16 ? chunk * H : ExpertChunk<T>::elements(int(chunk), C, H);
    g.resize(std::max({expert_scratch, N * (2 * QD + 2 * KVD), size_t(kHeadChunk) * m.vocab_size}));
    logits = g.data();
    expert_chunk32 = ExpertChunk<T>::carve(g.data(), int(chunk), C, H);  // fp32 products
    dq = g.data(), dk = dq + N * QD, dv = dk + N * KVD, datt = dv + N * KVD;
    if (use_bf16) {
      const size_t W = std::max({C, QD, KVD});
      xmid.resize(N * C), ye.resize(chunk * C);
      xe16.resize(chunk * C), dye16.resize(chunk * C), g16.resize(chunk * H), db16.resize(chunk * H);
      if constexpr (std::is_same_v<T, float>)
        expert_chunk = {int(chunk), xe16.data(), dye16.data(), g16.data(), db16.data(), ye.data(), g.data()};
      in16.resize(N * W), dout16.resize(N * W), logits16.resize(size_t(kHeadChunk) * m.vocab_size);
      w16.resize(layer_params), head16.resize(size_t(m.vocab_size) * C);
    }
    dtopk_w.resize(N * K), rlogits.resize(N * E), drlogits.resize(N * E);
    dx.resize(N * C), dh.resize(N * C);
    logits_lse.resize(kHeadChunk);
    final_norm_offset = layout.at("final_norm").offset;
    head_offset = layout.at(m.tie_embeddings ? "embed" : "head").offset;
  }

  RopeTable<T> rope;
  std::vector<std::vector<T>> x;  // [L+1][N,C] residual stream entering each block (x[L]: final norm input)
  std::vector<Layer> layers;
  std::vector<LayerOffsets> offsets;
  std::vector<T> rstdf;                // final norm [N] (its output goes to tmp)
  std::vector<int32_t> tokens;         // [N] inputs, for the embedding backward
  std::vector<T> tmp, g;               // scratch [N,C], and the shared block described above
  ExpertChunk<T> expert_chunk32{};     // fp32 products: the experts' chunk scratch, inside g
  std::vector<T> ye;                   // bf16 products: expert outputs or d(inputs) of one chunk [chunk,C]
  // bf16 products: the residual after attention [N,C] of the block at hand, recomputed in
  // backward from x and the kept bf16 attention output (one cheap bf16 product per block).
  std::vector<T> xmid;
  std::vector<T> wrow, dwrow;          // [R] combine weight of each row and its gradient
  // Scratch of the bf16 products: one chunk's dispatched rows and d(out) [chunk,C], gate and
  // d(W3 x) [chunk,H] (expert_chunk points at them), a product's input and output gradient
  // [N, max(C, QD, KVD)] each, d(logits) of one head chunk [kHeadChunk, V].
  std::vector<bf16> xe16, g16, db16, dye16, in16, dout16, logits16;
  ExpertChunkBf16 expert_chunk{};
  // bf16 copies of the weights: one block's at a time (w16 holds block w16_block, -1 when
  // stale), converted on entry to its forward and again to its backward unless still held,
  // and the LM head's for the whole step. 27 MB instead of a 235 MB copy of all parameters.
  std::vector<bf16> w16, head16;
  int w16_block = -1;
  size_t layer_params = 0;  // elements of the largest block
  std::vector<T> hn;        // a norm's output [N,C], recomputed in backward rather than kept per block
  std::vector<T> dtopk_w;              // [N,K]
  std::vector<T> rlogits, drlogits;    // [N,E]
  std::vector<T> dx, dh;               // [N,C]
  T *dq, *dk, *dv, *datt;              // [N,QD], [N,KVD] x2, [N,QD] inside g
  T* logits;                           // [kHeadChunk,V] inside g (free while the head runs)
  std::vector<T> logits_lse;           // [kHeadChunk]
  size_t final_norm_offset = 0, head_offset = 0;
};

}  // namespace atl
