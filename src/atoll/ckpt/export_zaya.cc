#include "atoll/ckpt/export_zaya.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"

namespace atl {
namespace {

// Our name within a block (after "layers.{i}.") -> transformers' after "model.layers.{i}.",
// from modeling_zaya.py: ZayaDecoderLayer (input_layernorm, self_attn, post_attention_layernorm,
// mlp, post_attention_residual_scale, post_mlp_residual_scale), ZayaResidualScaling,
// ZayaSparseMoeBlock (gate, experts), ZayaRouter (down_proj, router_states_scale, router_mlp,
// balancing_biases) and ZayaRouterMLP (norm, fc1, fc2, out_proj).
struct ZayaName {
  const char* ours;
  const char* theirs;
};
constexpr ZayaName kBlockNames[] = {
    {"attn_norm", "input_layernorm.weight"},
    {"moe_norm", "post_attention_layernorm.weight"},
    {"attn_merge.out_scale", "post_attention_residual_scale.hidden_states_scale"},
    {"attn_merge.out_bias", "post_attention_residual_scale.hidden_states_bias"},
    {"attn_merge.res_scale", "post_attention_residual_scale.residual_scale"},
    {"attn_merge.res_bias", "post_attention_residual_scale.residual_bias"},
    {"moe_merge.out_scale", "post_mlp_residual_scale.hidden_states_scale"},
    {"moe_merge.out_bias", "post_mlp_residual_scale.hidden_states_bias"},
    {"moe_merge.res_scale", "post_mlp_residual_scale.residual_scale"},
    {"moe_merge.res_bias", "post_mlp_residual_scale.residual_bias"},
    {"moe.gate.down", "mlp.gate.down_proj.weight"},
    {"moe.gate.down_bias", "mlp.gate.down_proj.bias"},
    {"moe.gate.depth_scale", "mlp.gate.router_states_scale"},
    {"moe.gate.norm", "mlp.gate.router_mlp.norm.weight"},
    {"moe.gate.fc1", "mlp.gate.router_mlp.fc1.weight"},
    {"moe.gate.fc1_bias", "mlp.gate.router_mlp.fc1.bias"},
    {"moe.gate.fc2", "mlp.gate.router_mlp.fc2.weight"},
    {"moe.gate.fc2_bias", "mlp.gate.router_mlp.fc2.bias"},
    {"moe.gate.out", "mlp.gate.router_mlp.out_proj.weight"},
    {"moe.gate.balancing_biases", "mlp.gate.balancing_biases"},
    {"moe.w2", "mlp.experts.down_proj"},  // [E, C, H] as it is
};
// CCA attention's rows are named as upstream after "self_attn." (model/attention_cca.h of the
// cca branch: "attn.qkv_proj.{q_proj, k_proj, v_proj_current, v_proj_delayed}.weight",
// "attn.qkv_proj.conv_qk_{depthwise,grouped}.{weight,bias}", "attn.qk_norm.temp",
// "attn.o_proj.weight"), so their export is a rename; GQA's rows ("attn.wq", ...) have none.
constexpr const char* kCcaRows[] = {"qkv_proj.q_proj.weight",          "qkv_proj.k_proj.weight",
                                    "qkv_proj.v_proj_current.weight",  "qkv_proj.v_proj_delayed.weight",
                                    "qkv_proj.conv_qk_depthwise.weight", "qkv_proj.conv_qk_depthwise.bias",
                                    "qkv_proj.conv_qk_grouped.weight", "qkv_proj.conv_qk_grouped.bias",
                                    "qk_norm.temp",                    "o_proj.weight"};
constexpr ZayaName kTopNames[] = {
    {"embed", "model.embed_tokens.weight"},
    {"input_scale", "model.input_hidden_states_scale"},
    {"input_bias", "model.input_hidden_states_bias"},
    {"final_norm", "model.norm.weight"},
    {"head", "lm_head.weight"},
};
// The attention kind ZAYA1's blocks use (model.attention).
constexpr const char* kZayaAttention = "cca";

bool every_layer(const ModelConfig& m, const std::string& (ModelConfig::*kind)(int) const, const char* want) {
  for (int l = 0; l < m.n_layers; ++l)
    if ((m.*kind)(l) != want) return false;
  return true;
}

std::string kinds_text(const ModelConfig& m) {
  const std::string att = m.attention_layers.empty() ? "\"" + m.attention + "\"" : "model.attention_layers";
  const std::string rt = m.router_layers.empty() ? "\"" + m.router + "\"" : "model.router_layers";
  return "model.attention = " + att + ", model.router = " + rt + ", model.top_k = " + std::to_string(m.top_k) +
         ", model.residual_scaling = " + (m.residual_scaling ? "true" : "false");
}

HfValues copy_of(std::string name, std::vector<int64_t> shape, const float* p, size_t n) {
  return {std::move(name), std::move(shape), std::vector<float>(p, p + n)};
}

HfValues filled(std::string name, int64_t n, float value) {
  return {std::move(name), {n}, std::vector<float>(size_t(n), value)};
}

}  // namespace

HfArchitecture hf_architecture(const ModelConfig& m) {
  const bool gqa = every_layer(m, &ModelConfig::attention_at, "gqa");
  const bool topk = every_layer(m, &ModelConfig::router_at, "topk");
  const bool zaya = every_layer(m, &ModelConfig::router_at, "zaya");
  const bool cca = every_layer(m, &ModelConfig::attention_at, kZayaAttention);
  // Mixtral has one RoPE base; a local layer with the same base is a global one.
  const bool one_theta = !m.any_rope_local() || m.rope_theta_local == m.rope_theta;
  if (gqa && topk && !m.residual_scaling && (m.shared_expert_hidden > 0 || m.qkv_bias)) {
    if (m.shared_expert_hidden == 0 || m.qk_norm != "none" || !one_theta)
      throw ConfigError("cannot export this model to Hugging Face: the architecture with a shared expert and q/k/v "
                        "biases is Qwen2-MoE, whose every block has a shared expert (model.shared_expert_hidden > 0), "
                        "no q/k norm (model.qk_norm = \"none\") and one rope_theta (model.rope_layers empty); fix: "
                        "train such a model, or one with model.shared_expert_hidden = 0 and model.qkv_bias = false");
    return HfArchitecture::kQwen2Moe;
  }
  if (gqa && topk && !m.residual_scaling) {
    if (one_theta && m.qk_norm == "head") return HfArchitecture::kQwen3Moe;
    if (one_theta && m.qk_norm == "proj") return HfArchitecture::kOlmoe;
    if (one_theta && !m.router_renormalize && m.n_experts > 1)
      throw ConfigError("cannot export this model as Mixtral: model.router_renormalize = false, and Mixtral always "
                        "renormalises its top-k weights; fix: train with model.router_renormalize = true, or with "
                        "model.qk_norm = \"head\" or \"proj\" (Qwen3-MoE's and OLMoE's exports keep norm_topk_prob)");
    if (one_theta) return HfArchitecture::kMixtral;
    throw ConfigError("cannot export this model as Mixtral: model.rope_layers makes some layers local with "
                      "model.rope_theta_local != model.rope_theta, and Mixtral has one rope_theta; fix: train with "
                      "model.rope_layers empty (or ZAYA1's parts, whose export has a RoPE base per layer type)");
  }
  if (zaya && cca && m.top_k == 1) return HfArchitecture::kZaya;
  throw ConfigError("cannot export this model to Hugging Face: " + kinds_text(m) +
                    " is neither Mixtral (model.attention = \"gqa\", model.router = \"topk\", "
                    "model.residual_scaling = false) nor ZAYA1 (model.attention = \"" + kZayaAttention +
                    "\", model.router = \"zaya\", model.top_k = 1, residual scaling on or off) in every block; "
                    "fix: train one of those two architectures to export it");
}

std::string hf_zaya_name(const ParamEntry& e) {
  auto find_name = [](const auto& table, const std::string& ours) -> std::string {
    for (const ZayaName& n : table)
      if (*n.ours && ours == n.ours) return n.theirs;
    return "";
  };
  if (e.layer < 0) return find_name(kTopNames, e.name);
  const std::string ours = e.name.substr(layer_prefix(e.layer).size());
  const std::string hf = "model.layers." + std::to_string(e.layer) + ".";
  if (ours == "moe.w1") return hf + "mlp.experts.gate_up_proj";
  for (const char* row : kCcaRows)
    if (ours == std::string("attn.") + row) return hf + "self_attn." + row;
  const std::string theirs = find_name(kBlockNames, ours);
  return theirs.empty() ? "" : hf + theirs;
}

std::vector<HfValues> hf_zaya_tensors(const ModelConfig& m, const ParamLayout& layout, const float* params) {
  ATOLL_CHECK(hf_architecture(m) == HfArchitecture::kZaya);
  const int64_t C = m.dim, E = m.n_experts, H = m.expert_hidden;
  std::vector<HfValues> out;
  for (const ParamEntry& e : layout.entries()) {
    const float* p = params + e.offset;
    const std::string pre = e.layer >= 0 ? layer_prefix(e.layer) : "";
    if (e.name == pre + "moe.w3") continue;  // packed with moe.w1 into gate_up_proj
    const std::string name = hf_zaya_name(e);
    if (name.empty()) throw Error("cannot export parameter '" + e.name + "' as ZAYA1: no upstream name for it");
    if (e.name == pre + "moe.w1") {
      // gate_up_proj [E, 2H, C]: expert e's gate rows (our W1, silu's input) then its up rows (W3),
      // as transformers' experts chunk the product into gate and up.
      const float* w3 = params + layout.at(pre + "moe.w3").offset;
      HfValues t{name, {E, 2 * H, C}, std::vector<float>(size_t(E * 2 * H * C))};
      for (int64_t x = 0; x < E; ++x) {
        std::copy(p + x * H * C, p + (x + 1) * H * C, t.values.begin() + x * 2 * H * C);
        std::copy(w3 + x * H * C, w3 + (x + 1) * H * C, t.values.begin() + (x * 2 + 1) * H * C);
      }
      out.push_back(std::move(t));
      continue;
    }
    out.push_back(copy_of(name, e.shape, p, e.numel));
  }
  if (!m.residual_scaling) {  // the exact mapping: residual scaling at the identity
    out.push_back(filled("model.input_hidden_states_scale", C, 1.0f));
    out.push_back(filled("model.input_hidden_states_bias", C, 0.0f));
    for (int l = 0; l < m.n_layers; ++l)
      for (const char* s : {"post_attention_residual_scale.", "post_mlp_residual_scale."}) {
        const std::string p = "model.layers." + std::to_string(l) + "." + s;
        out.push_back(filled(p + "hidden_states_scale", C, 1.0f));
        out.push_back(filled(p + "hidden_states_bias", C, 0.0f));
        out.push_back(filled(p + "residual_scale", C, 1.0f));
        out.push_back(filled(p + "residual_bias", C, 0.0f));
      }
  }
  return out;
}

std::vector<HfPiece> hf_zaya_pieces(const ParamLayout& layout) {
  std::vector<HfPiece> out;
  for (const ParamEntry& e : layout.entries()) {
    const std::string pre = e.layer >= 0 ? layer_prefix(e.layer) : "";
    const bool w3 = e.name == pre + "moe.w3";
    const std::string name = w3 ? hf_zaya_name(layout.at(pre + "moe.w1")) : hf_zaya_name(e);
    if (name.empty()) throw Error("cannot import parameter '" + e.name + "' from ZAYA1: no upstream name for it");
    if (w3 || e.name == pre + "moe.w1") {  // gate_up_proj [E, 2H, C]: gate rows (W1), then up rows (W3)
      const int64_t E = e.shape[0], H = e.shape[1], C = e.shape[2];
      for (int64_t x = 0; x < E; ++x)
        out.push_back({name, {E, 2 * H, C}, x * 2 * H + (w3 ? H : 0), H, e.offset + size_t(x * H * C)});
      continue;
    }
    const int64_t rows = e.shape.empty() ? 1 : int64_t(e.numel) / e.shape.back();
    out.push_back({name, e.shape, 0, rows, e.offset});
  }
  return out;
}

std::string hf_zaya_config_json(const ModelConfig& m) {
  // Field names and meanings of transformers' ZayaConfig (LagunaConfig's fields it keeps, plus
  // router_hidden_size and cca_time0/1). rope_parameters is written per layer type in full, so
  // partial_rotary_factor is never left to a default. Global layers are type "hybrid"; local
  // ones (model.rope_layers) "hybrid_sliding", the only other type, with their own rope_theta.
  // Upstream requires a sliding_window there and masks keys more than sliding_window - 1 back:
  // seq_len (max_position_embeddings) keeps every key of the context, so attention stays full.
  auto rope = [&](double theta) {
    return nlohmann::ordered_json{
        {"rope_type", "default"}, {"rope_theta", theta}, {"partial_rotary_factor", m.partial_rotary_factor}};
  };
  const bool local = m.any_rope_local();
  std::vector<std::string> layer_types;
  for (int l = 0; l < m.n_layers; ++l) layer_types.push_back(m.rope_local_at(l) ? "hybrid_sliding" : "hybrid");
  nlohmann::ordered_json rope_parameters = {{"hybrid", rope(m.rope_theta)}};
  if (local) rope_parameters["hybrid_sliding"] = rope(m.rope_theta_local);
  nlohmann::ordered_json j = {
      {"architectures", {"ZayaForCausalLM"}},
      {"model_type", "zaya"},
      {"vocab_size", m.vocab_size},
      {"hidden_size", m.dim},
      {"num_hidden_layers", m.n_layers},
      {"num_attention_heads", m.n_heads},
      {"num_key_value_heads", m.n_kv_heads},
      {"head_dim", m.head_dim},
      {"num_experts", m.n_experts},
      {"num_experts_per_tok", m.top_k},
      {"moe_intermediate_size", m.expert_hidden},
      {"router_hidden_size", m.router_hidden_size},
      {"cca_time0", m.cca_time0},
      {"cca_time1", m.cca_time1},
      {"hidden_act", "silu"},
      {"max_position_embeddings", m.seq_len},
      {"rms_norm_eps", m.norm_eps},
      {"tie_word_embeddings", m.tie_embeddings},
      {"layer_types", layer_types},
      {"rope_parameters", rope_parameters},
      {"sliding_window", local ? nlohmann::ordered_json(m.seq_len) : nlohmann::ordered_json(nullptr)},
      {"attention_bias", false},
      {"lm_head_bias", false},
      {"attention_dropout", 0.0},
      {"initializer_range", m.init_std},
      {"output_router_logits", false},
      {"use_cache", true},
      {"torch_dtype", "float32"},
  };
  return j.dump(2) + "\n";
}

}  // namespace atl
