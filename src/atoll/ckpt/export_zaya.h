// Export to the Hugging Face ZAYA1 layout (transformers' ZayaForCausalLM, "model_type": "zaya",
// the merged layout: num_hidden_layers blocks, each CCA attention then the MoE): config.json
// with ZayaConfig's keys and every tensor under its upstream name and shape, including those
// transformers would re-initialise if they were missing (the residual scales, router_states_scale,
// balancing_biases, qk_norm.temp). Which architecture a model exports as is hf_architecture's
// call; ckpt/export_hf.h writes the folder.
//
// Exact mappings where a model lacks one of ZAYA1's changes (written, not refused):
//   - no residual scaling (model.residual_scaling = false): the identity, scales 1 and biases 0;
//   - no mixture of depths: a skip class that is never chosen is model.router_skip_bias = -1e4,
//     which atoll trains as it is (its router always has the skip class in its softmax);
//   - the first block's router has no router_states_scale, in atoll as upstream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "atoll/ckpt/hf_tables.h"
#include "atoll/config/config.h"
#include "atoll/model/layout.h"

namespace atl {

enum class HfArchitecture { kMixtral, kZaya, kQwen3Moe, kOlmoe, kQwen2Moe };

// Mixtral: every block GQA attention and the top-k router, no residual scaling, no q/k norm and
// renormalised router weights. Qwen3-MoE and OLMoE: the same with model.qk_norm "head" and "proj"
// (their norm_topk_prob is model.router_renormalize). Qwen2-MoE: the same without q/k norm, with a
// shared expert (model.shared_expert_hidden > 0) and q/k/v biases or not (qkv_bias). A shared
// expert or q/k/v biases in any other mix have no architecture. ZAYA1: every block CCA attention and the
// zaya router with top_k 1. Anything else: ConfigError naming the keys that make the mix and the fix.
HfArchitecture hf_architecture(const ModelConfig& m);

// One exported tensor with its values (a copy; the expert tensors are re-packed).
struct HfValues {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The upstream name of one of our rows ("model.layers.{i}.mlp.gate.down_proj.weight"), or "" for
// a row with none: moe.w3 (packed with moe.w1 into mlp.experts.gate_up_proj, which moe.w1 names)
// and GQA's attention rows. CCA's rows (the cca branch) map by name: "attn.X" -> "self_attn.X".
std::string hf_zaya_name(const ParamEntry& e);

// The ZAYA1 tensors of a model (hf_architecture(m) == kZaya), in layout order. Throws Error for a
// row with no upstream name.
std::vector<HfValues> hf_zaya_tensors(const ModelConfig& m, const ParamLayout& layout, const float* params);

// The ZAYA1 tensors as pieces of our buffer (ckpt/hf_tables.h), for the import: moe.w1 and moe.w3
// are the gate and up halves of each expert's rows of gate_up_proj [E, 2H, C]; every other row is
// a whole tensor named by hf_zaya_name. The layout must have residual scaling (the import's: the
// export writes the identity for a model without). Throws Error for a row with no upstream name.
std::vector<HfPiece> hf_zaya_pieces(const ParamLayout& layout);

// transformers' ZayaConfig for `m`, as config.json holds it.
std::string hf_zaya_config_json(const ModelConfig& m);

}  // namespace atl
