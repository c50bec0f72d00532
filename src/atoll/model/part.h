// Block parts: each piece of a transformer block (an attention kind, a router kind, the
// experts, the norms and residuals) is one file pair that declares
//   - its rows of the layout table (a free function `<part>_rows(layout, config, layer)`,
//     called by model/block.cc in the table's order),
//   - the activations it keeps for backward (members, sized for PartSizes::max_tokens),
//   - its forward, its backward (the same steps reversed), and its decode step: one token,
//     with a cache where the part looks across positions (attention's keys and values), and its
//     prefill (a block of tokens into that cache at once); position-wise parts decode and
//     prefill by their forward.
// The interfaces below are what the block composes (model/block.h); a CUDA mirror of a part
// sits beside it (e.g. attention_gqa.cu beside attention_gqa.cc) with the same structure.
//
// Buffers: a part owns what it keeps per layer; scratch that no call keeps comes from a pool
// shared by every layer's part of one kind (PartScratch), and one work buffer of T shared by
// all parts and the head (PartContext::work, at least every part's work_elements()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <typeindex>

#include "atoll/core/timer.h"
#include "atoll/layers/router.h"
#include "atoll/model/layout.h"
#include "atoll/model/model_config.h"
#include "atoll/model/precision.h"

namespace atl {

class Collective;
struct ZigzagLayout;

// Seconds spent per phase, accumulated until reset (for `atoll bench`).
struct PhaseTimes {
  double embed = 0, attention = 0, router_dispatch = 0, experts = 0, head_loss = 0;
  double weights_bf16 = 0;  // rounding the parameters to bf16 once per forward (bf16 products)
  double total() const { return embed + attention + router_dispatch + experts + head_loss + weights_bf16; }
};

// The sizes one block works with, for B sequences (see the legend in model_config.h); shared by
// the CPU model and the device model (model/device_model.cu).
struct BlockDims {
  int T, N, C, E, K, H, QD, KVD;
};
inline BlockDims block_dims(const ModelConfig& m, int B) {
  return {m.seq_len, B * m.seq_len, m.dim, m.n_experts, m.top_k, m.expert_hidden, m.n_heads * m.head_dim,
          m.n_kv_heads * m.head_dim};
}

// What a part allocates for: at most max_batch sequences of the config's seq_len (training),
// or one token (decoding: max_batch = 1, max_tokens = 1).
struct PartSizes {
  int max_batch = 1;
  int max_tokens = 1;
  Precision precision = Precision::kFp32;
};

// Scratch shared by every layer's part of one kind: the first part that asks creates it.
class PartScratch {
 public:
  template <class S, class... Args>
  std::shared_ptr<S> get(Args&&... args) {
    std::shared_ptr<void>& slot = items_[std::type_index(typeid(S))];
    if (!slot) slot = std::make_shared<S>(std::forward<Args>(args)...);
    return std::static_pointer_cast<S>(slot);
  }

 private:
  std::map<std::type_index, std::shared_ptr<void>> items_;
};

// Where a call's tokens sit in their sequences. The T tokens of each sequence a call holds are
// `runs` runs, run i of len[i] tokens starting at position start[i] of the whole sequence
// (RoPE rotates by it; CCA's convolutions look back from it). len[0] = 0 means one run of all
// T tokens: the default, a whole sequence from position 0. Context parallelism's zigzag layout
// (model/ring_attention.h) gives a worker two chunks of 2P, r and 2P-1-r, so two runs.
struct TokenPositions {
  static constexpr int kMaxRuns = 2;
  int runs = 1;
  int start[kMaxRuns] = {0, 0};
  int len[kMaxRuns] = {0, 0};
  bool whole() const { return runs == 1 && start[0] == 0; }
};

// What one call of a part sees: the batch at hand, the products in the model's precision over
// the parameters, the gradients (+=), the shared work buffer and the timers.
template <typename T>
struct PartContext {
  int B;              // sequences (decoding: 1)
  BlockDims d;        // d.N tokens (decoding: 1)
  Products<T> mm;     // params, bf16 weights, matrix products
  T* grads;           // flat gradients (+=); null when decoding
  T* work;            // shared scratch, at least every part's work_elements()
  double loss_scale;  // factor of the loss whose gradient backward accumulates
  PhaseTimes* times;  // null: not timed
  TokenPositions pos{};  // where the tokens sit (default: whole sequences)
  // Context parallelism (model/ring_attention.h): the group whose ranks hold the other chunks of
  // these sequences and how they are split; null: the call holds whole sequences. Decoding:
  // the group the KV cache is sharded over (tree attention, model/cached_attention.h).
  Collective* cp = nullptr;
  const ZigzagLayout* zigzag = nullptr;
  double* timer(double PhaseTimes::*phase) const { return times ? &(times->*phase) : nullptr; }
};

// Causal mixing across positions: out[N,C] from the normed residual h[N,C].
template <typename T>
class AttentionPart {
 public:
  virtual ~AttentionPart() = default;
  virtual size_t work_elements() const = 0;
  // out[N,C] (=); keeps what backward needs.
  virtual void forward(T* out, const T* h, const PartContext<T>& c) = 0;
  // out[N,C] (=) forward's output again, bit for bit, from what forward kept.
  virtual void recompute_output(T* out, const PartContext<T>& c) = 0;
  // dh[N,C] (+=) and the weight gradients (+=) from dout[N,C]; h as in forward.
  virtual void backward(T* dh, const T* dout, const T* h, const PartContext<T>& c) = 0;
  // Decoding: allocates the cache for max_len positions, of which this process keeps cache_rows
  // (max_len; under tree attention its shard's, CacheShard::rows), called again with a larger
  // max_len to grow it, keeping the positions cached so far; then out[C] (=) for the token h[C]
  // at position pos, whose keys and values join the cache.
  virtual void start_decode(int max_len, int cache_rows) = 0;
  virtual void decode(T* out, const T* h, int pos, const PartContext<T>& c) = 0;
  // Prefill: out[N,C] (=) for the c.d.N tokens h[N,C] at positions [pos, pos + N) of one
  // sequence, continuing the cache (what decode steps over them would leave, and their outputs
  // up to rounding): their keys and values join it, and each attends to the cache up to itself.
  // N <= PartSizes::max_tokens; the cache holds pos + N positions (start_decode).
  virtual void prefill(T* out, const T* h, int pos, const PartContext<T>& c) = 0;
};

// Chooses K experts per token: topk_idx[N,K] (kNoExpert, layers/moe_dispatch.h, for a slot no
// expert computes), topk_w[N,K] (combine weights), and the auxiliary losses of this layer.
//
// A router may read state from the router of the block before it (ZAYA1's depth averaging,
// model/router_zaya.h): the model links each block's router to the previous block's once
// (link_previous, in layer order, before any forward). A router that keeps such state reads the
// previous router's kept state in its forward, and in its backward hands that router the
// gradient of it, which the previous router's backward (called next, the blocks run in reverse)
// adds to its own. Routers without depth state ignore the link.
template <typename T>
class RouterPart {
 public:
  virtual ~RouterPart() = default;
  virtual void link_previous(RouterPart& prev) { (void)prev; }
  virtual size_t work_elements() const = 0;
  virtual RouterLosses forward(const T* h, const PartContext<T>& c) = 0;
  virtual const int32_t* topk_idx() const = 0;
  virtual const T* topk_w() const = 0;
  // dh[N,C] (+=) and the router's gradients (+=) from dtopk_w[N,K] and loss_scale times the
  // auxiliary losses' gradients.
  virtual void backward(T* dh, const T* dtopk_w, const T* h, const PartContext<T>& c) = 0;
};

// The experts with dispatch and combine: out[n] = Σ_j topk_w[n,j] Expert_topk_idx[n,j](h[n]).
template <typename T>
class ExpertsPart {
 public:
  virtual ~ExpertsPart() = default;
  virtual size_t work_elements() const = 0;
  // out[N,C] (=); keeps what backward needs.
  virtual void forward(T* out, const T* h, const int32_t* topk_idx, const T* topk_w, const PartContext<T>& c) = 0;
  // dh[N,C] (+=), dtopk_w[N,K] (=) and the experts' gradients (+=) from dout[N,C].
  virtual void backward(T* dh, T* dtopk_w, const T* dout, const T* h, const T* topk_w, const PartContext<T>& c) = 0;
};

}  // namespace atl
