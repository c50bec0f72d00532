// Autoregressive decoding with a KV cache: one token at a time, each step attends to the
// cached keys and values of every earlier position instead of recomputing them. Uses the same
// layer functions as training (with N = 1), so it computes the model that was trained.
#pragma once

#include <cstdint>
#include <vector>

#include "atoll/model/model_config.h"
#include "atoll/core/rng.h"
#include "atoll/layers/rope.h"
#include "atoll/model/layout.h"

namespace atl {

class Decoder {
 public:
  // params [layout.total()] must outlive the decoder. max_len bounds prompt + generated tokens.
  Decoder(const ModelConfig& m, const float* params, int max_len);

  // Feeds `token` at position pos() and returns the logits [V] for the next position.
  const std::vector<float>& step(int32_t token);
  int pos() const { return pos_; }
  int max_len() const { return max_len_; }
  void reset() { pos_ = 0; }

 private:
  void attend(int l);
  void moe(int l);

  ModelConfig m_;
  ParamLayout layout_;
  const float* p_;
  int max_len_, pos_ = 0;
  RopeTable<float> rope_;
  std::vector<std::vector<float>> k_cache_, v_cache_;  // [L][max_len, NKV*HD]
  std::vector<float> x_, h_, q_, att_, tmp_, rl_, probs_, w_, a_, b_, g_, y_, logits_;
  std::vector<int32_t> idx_;
  float rstd_ = 0, lse_ = 0;
};

struct SampleOptions {
  double temperature = 0.8;  // 0 = greedy
  double top_p = 0.95;       // nucleus: smallest set of tokens whose probability reaches top_p
};

// Draws the next token from logits [V].
int32_t sample_token(const std::vector<float>& logits, const SampleOptions& opts, Rng& rng);

}  // namespace atl
