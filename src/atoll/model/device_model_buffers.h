// Device buffers of DeviceModel (private to device_model.cu), as model/model_buffers.h for
// Model<T>: what each block keeps for its backward pass (Layer), and scratch shared by all
// blocks. Every buffer is carved from one arena: carve() runs once to count the bytes and once
// to hand them out, so the two can never disagree.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "atoll/backend/cuda/arena.h"
#include "atoll/backend/cuda/attention.h"
#include "atoll/backend/cuda/embedding.h"
#include "atoll/backend/cuda/expert_mlp.h"
#include "atoll/backend/cuda/moe_dispatch.h"
#include "atoll/backend/cuda/rope.h"
#include "atoll/backend/cuda/router.h"
#include "atoll/model/layout.h"
#include "atoll/model/model_config.h"

namespace atl::gpu {

// Offsets of one block's tensors in the flat buffers, read once from the layout table.
struct DeviceLayerOffsets {
  size_t attn_norm, wq, wk, wv, wo, moe_norm, router, w1, w3, w2;
};

// Hands out buffers from `arena`, or with no arena only counts the bytes they would take.
class Carver {
 public:
  explicit Carver(DeviceArena* arena) : arena_(arena) {}
  template <typename T>
  T* take(size_t n) {
    bytes_ += (n * sizeof(T) + DeviceArena::kAlign - 1) / DeviceArena::kAlign * DeviceArena::kAlign;
    return arena_ ? arena_->alloc<T>(n) : nullptr;
  }
  size_t bytes() const { return bytes_; }

 private:
  DeviceArena* arena_;
  size_t bytes_ = 0;
};

struct DeviceBuffers {
  struct Layer {
    float* rstd1;           // attention norm [N] (its output is recomputed in backward)
    float *q, *k, *v;       // after RoPE [N,NH*HD], [N,NKV*HD], [N,NKV*HD]
    float *att, *lse;       // attention out [N,NH*HD], row log-sum-exp [B,NH,T]
    float* xmid;            // residual after attention [N,C]
    float* rstd2;           // MoE norm [N] (its output is recomputed in backward)
    float *probs, *rlse;    // router probabilities [N,E], logsumexp [N]
    int32_t* topk_idx;      // [N,K]
    float* topk_w;          // [N,K]
    float *a, *b;           // expert pre-activations [R,H]
    DeviceRouting routing;  // offsets [E+1], row_token [R], slot_row [R]
  };

  float *params, *grads;   // [layout.total()]
  std::vector<float*> x;   // [L+1][N,C] residual stream entering each block (x[L]: final norm input)
  std::vector<Layer> layers;
  float *hn, *tmp;         // a norm's output (recomputed in backward), scratch [N,C]
  float *dx, *dh;          // [N,C]
  float *dq, *dk, *dv, *datt;  // [N,QD], [N,KVD] x2, [N,QD]
  float *rlogits, *drlogits;   // [N,E]
  float* dtopk_w;              // [N,K]
  float* rstdf;                // final norm [N] (its output goes to tmp)
  float *logits, *ce_lse;      // one head chunk: [head_rows,V], [head_rows]
  float* ce_loss;              // [N] cross-entropy of each position
  float* attn_scratch;         // attention_scratch_floats(B, T, NH)
  ExpertScratch experts;       // [R,C] x3, [R,H] x3
  int32_t *tokens, *targets;   // [N]
  int32_t* ids_scratch;        // routing and the sorted embedding backward
  int32_t* router_counts;      // [E] router_backward's scratch
  double* losses;              // [L,2] aux and z of each layer
  double* loss_scratch;        // router_losses_scratch_doubles(E)
  float *rope_cos, *rope_sin;  // [T, HD/2]
  // bf16 products only (null in fp32): the parameters rounded once per forward, and the
  // rounded copies of the products' activation inputs (everything else stays fp32).
  uint16_t* w16;               // [layout.total()]
  uint16_t *in16, *dout16;     // [N, max(C,QD,KVD)] a product's input; its d(output)
  uint16_t* logits16;          // [head_rows,V] one head chunk's d(logits)
};

// Takes every buffer for up to max_batch sequences from `c` (see Carver); the bf16 copies only
// when `bf16` (train.precision = bf16).
inline void carve(DeviceBuffers& d, const ModelConfig& m, size_t total, int max_batch, int head_rows, bool bf16,
                  Carver& c) {
  const size_t N = size_t(max_batch) * m.seq_len, C = m.dim, E = m.n_experts, K = m.top_k, H = m.expert_hidden;
  const size_t QD = size_t(m.n_heads) * m.head_dim, KVD = size_t(m.n_kv_heads) * m.head_dim, R = N * K;
  d.params = c.take<float>(total);
  d.grads = c.take<float>(total);
  d.x.assign(m.n_layers + 1, nullptr);
  for (auto& x : d.x) x = c.take<float>(N * C);
  d.layers.assign(m.n_layers, {});
  for (auto& s : d.layers) {
    s.rstd1 = c.take<float>(N);
    s.q = c.take<float>(N * QD), s.k = c.take<float>(N * KVD), s.v = c.take<float>(N * KVD);
    s.att = c.take<float>(N * QD), s.lse = c.take<float>(size_t(max_batch) * m.n_heads * m.seq_len);
    s.xmid = c.take<float>(N * C);
    s.rstd2 = c.take<float>(N);
    s.probs = c.take<float>(N * E), s.rlse = c.take<float>(N);
    s.topk_idx = c.take<int32_t>(N * K), s.topk_w = c.take<float>(N * K);
    s.a = c.take<float>(R * H), s.b = c.take<float>(R * H);
    s.routing = {c.take<int32_t>(E + 1), c.take<int32_t>(R), c.take<int32_t>(R)};
  }
  d.hn = c.take<float>(N * C), d.tmp = c.take<float>(N * C);
  d.dx = c.take<float>(N * C), d.dh = c.take<float>(N * C);
  d.dq = c.take<float>(N * QD), d.dk = c.take<float>(N * KVD), d.dv = c.take<float>(N * KVD);
  d.datt = c.take<float>(N * QD);
  d.rlogits = c.take<float>(N * E), d.drlogits = c.take<float>(N * E);
  d.dtopk_w = c.take<float>(N * K);
  d.rstdf = c.take<float>(N);
  d.logits = c.take<float>(size_t(head_rows) * m.vocab_size), d.ce_lse = c.take<float>(head_rows);
  d.ce_loss = c.take<float>(N);
  d.attn_scratch = c.take<float>(attention_scratch_floats(max_batch, m.seq_len, m.n_heads));
  d.experts = {c.take<float>(R * C), c.take<float>(R * C), c.take<float>(R * C),
               c.take<float>(R * H), c.take<float>(R * H), c.take<float>(R * H),
               nullptr, nullptr, nullptr, nullptr, nullptr};
  if (bf16) {
    d.experts.xe16 = c.take<uint16_t>(R * C), d.experts.dye16 = c.take<uint16_t>(R * C);
    d.experts.g16 = c.take<uint16_t>(R * H), d.experts.da16 = c.take<uint16_t>(R * H);
    d.experts.db16 = c.take<uint16_t>(R * H);
    d.w16 = c.take<uint16_t>(total);
    d.in16 = c.take<uint16_t>(N * std::max({C, QD, KVD})), d.dout16 = c.take<uint16_t>(N * std::max({C, QD, KVD}));
    d.logits16 = c.take<uint16_t>(size_t(head_rows) * m.vocab_size);
  } else {
    d.w16 = d.in16 = d.dout16 = d.logits16 = nullptr;
  }
  d.tokens = c.take<int32_t>(N), d.targets = c.take<int32_t>(N);
  d.ids_scratch = c.take<int32_t>(
      size_t(std::max(routing_scratch_ints(int(N), int(K)), embedding_scratch_ints(int(N)))));
  d.router_counts = c.take<int32_t>(E);
  d.losses = c.take<double>(2 * size_t(m.n_layers));
  d.loss_scratch = c.take<double>(size_t(router_losses_scratch_doubles(int(E))));
  d.rope_cos = c.take<float>(size_t(m.seq_len) * (m.head_dim / 2));
  d.rope_sin = c.take<float>(size_t(m.seq_len) * (m.head_dim / 2));
}

inline std::vector<DeviceLayerOffsets> layer_offsets(const ModelConfig& m, const ParamLayout& layout) {
  std::vector<DeviceLayerOffsets> out;
  for (int l = 0; l < m.n_layers; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    auto off = [&](const char* name) { return layout.at(pre + name).offset; };
    out.push_back({off("attn_norm"), off("attn.wq"), off("attn.wk"), off("attn.wv"), off("attn.wo"), off("moe_norm"),
                   off("moe.router"), off("moe.w1"), off("moe.w3"), off("moe.w2")});
  }
  return out;
}

}  // namespace atl::gpu
