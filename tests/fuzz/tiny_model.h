// The model of the manifest target's checkpoint (manifest_fuzz.cc) and of its seed
// (make_seeds.cc): as small as a layout gets, so each fuzz input reads a 2 KB rank file.
#pragma once

#include "atoll/model/model_config.h"

namespace atl::fuzz {

inline ModelConfig tiny_model() {
  ModelConfig m;
  m.vocab_size = 8;
  m.dim = 4;
  m.n_layers = 1;
  m.n_heads = 1;
  m.n_kv_heads = 1;
  m.head_dim = 4;
  m.n_experts = 2;
  m.top_k = 1;
  m.expert_hidden = 4;
  m.seq_len = 4;
  return m;
}

}  // namespace atl::fuzz
