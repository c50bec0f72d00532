// Autoregressive decoding with a KV cache: one token at a time, each step attends to the
// cached keys and values of every earlier position instead of recomputing them. Runs the
// training model's own blocks (model/block.h) through their parts' decode steps, so it
// computes the model that was trained.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/model/layout.h"
#include "atoll/model/model_config.h"
#include "atoll/model/part_kinds.h"

namespace atl {

class Decoder {
 public:
  // params [layout.total()] must outlive the decoder. max_len bounds the positions fed (prompt
  // and generated tokens). The KV cache starts at a few positions and doubles when full, up to
  // max_len, so a large bound costs memory only as tokens come.
  //
  // Tree attention: with a group, the P ranks of `group` each run a Decoder together (the same
  // tokens, step by step) and shard every layer's KV cache, position t on rank t mod P; each
  // attention combines the ranks' partial results, sent to every rank at once
  // (model/cached_attention.h attend_token), and every rank returns the same logits.
  //
  // Prefill: prefill() feeds a block of tokens at once through the training model's kernels
  // (batched products, blocked attention), at most max_block tokens a pass: the buffers of one
  // pass are sized for max_block tokens (1: step() only), so it bounds what a long prompt costs
  // beyond its cache. Under a group every rank computes every token of the block (the weights
  // are replicated) and keeps only its shard of the cache; the block's attention to the cache
  // is divided among the ranks as a step's is.
  Decoder(const ModelConfig& m, const float* params, int max_len, Collective* group = nullptr, int max_block = 1);
  ~Decoder();

  // Feeds `token` at position pos() and returns the logits [V] for the next position.
  const std::vector<float>& step(int32_t token);
  // Feeds ids[n] at positions [pos(), pos() + n), max_block at a time, and returns the logits [V]
  // after the last: what n step() calls return last, up to rounding, leaving the same cache.
  const std::vector<float>& prefill(const int32_t* ids, int n);
  int pos() const { return pos_; }
  int max_len() const { return max_len_; }
  int capacity() const { return capacity_; }  // positions the cache holds now
  int max_block() const { return max_block_; }
  void reset() { pos_ = 0; }

 private:
  struct State;  // the blocks and their buffers for max_block tokens (decoder.cc)
  void reserve(int len);  // grows the cache to hold len positions
  // ids[n] through the embedding, the blocks (a step's decode, or prefill) and the head of the last.
  const std::vector<float>& feed(const int32_t* ids, int n);
  ModelConfig m_;
  ParamLayout layout_;
  const float* p_;
  Collective* group_ = nullptr;
  int max_len_, max_block_, capacity_, pos_ = 0;
  std::unique_ptr<State> s_;
  std::vector<float> logits_;
};

// What decoding keeps, in bytes: the sum over the layers of their part kinds' decode caches
// (model/part_kinds.h).
KvCacheBytes kv_cache_bytes(const ModelConfig& m);
// Per token, for multi-head attention at equal width: C/HD heads of HD, keys and values of C each.
double mha_kv_cache_bytes_per_token(const ModelConfig& m);

struct SampleOptions {
  double temperature = 0.8;  // finite, >= 0; 0 = greedy
  double top_p = 0.95;       // in (0, 1]; nucleus: smallest set of tokens whose probability reaches top_p
  int vocab = 0;             // draw among ids [0, vocab) only (a tokenizer's); 0 = all of [V]
};

// Draws the next token from logits [V].
int32_t sample_token(const std::vector<float>& logits, const SampleOptions& opts, Rng& rng);

}  // namespace atl
