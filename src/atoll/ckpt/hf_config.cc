// config.json of a Hugging Face folder -> atoll's [model] (ckpt/import_hf.h read_hf_source).
#include <filesystem>
#include <set>

#include "atoll/ckpt/file_io.h"
#include "atoll/ckpt/import_hf.h"
#include "atoll/core/errors.h"

namespace fs = std::filesystem;

namespace atl {
namespace {

// Fields that change nothing the weights compute (ids, storage dtype, generation and output
// switches of transformers; the training settings initializer_range and router_aux_loss_coef,
// which the run's own init_std and aux_loss_coef replace): listed in the init_from event.
const std::set<std::string> kNoEffect = {
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "use_cache", "bos_token_id",
    "eos_token_id", "pad_token_id", "output_router_logits", "_name_or_path", "return_dict", "output_attentions",
    "output_hidden_states", "max_position_embeddings", "pretraining_tp", "id2label", "label2id",
    "initializer_range", "router_aux_loss_coef"};

// model_type -> the architecture it is imported as.
const std::pair<const char*, const char*> kArchitectures[] = {
    {"mixtral", "MixtralForCausalLM"}, {"zaya", "ZayaForCausalLM"},   {"llama", "LlamaForCausalLM"},
    {"mistral", "MistralForCausalLM"}, {"qwen3_moe", "Qwen3MoeForCausalLM"}, {"olmoe", "OlmoeForCausalLM"},
    {"qwen2_moe", "Qwen2MoeForCausalLM"},
};

struct Reader {
  const nlohmann::json& j;
  std::string path;
  std::set<std::string> used;

  [[noreturn]] void refuse(const std::string& key, const std::string& why) const {
    throw ConfigError(path + ": field " + key + " = " + (j.contains(key) ? j.at(key).dump() : "(missing)") + ": " + why);
  }
  bool has(const std::string& k) const { return j.contains(k) && !j.at(k).is_null(); }
  int integer(const std::string& k, int fallback, bool required) {
    used.insert(k);
    if (!has(k)) {
      if (required) refuse(k, "atoll needs it to know the model's shape (fix: add it to config.json)");
      return fallback;
    }
    if (!j.at(k).is_number_integer() || j.at(k).get<int64_t>() <= 0 || j.at(k).get<int64_t>() > (1 << 30))
      refuse(k, "not a positive integer");
    return j.at(k).get<int>();
  }
  double number(const std::string& k, double fallback) {
    used.insert(k);
    if (!has(k)) return fallback;
    if (!j.at(k).is_number()) refuse(k, "not a number");
    return j.at(k).get<double>();
  }
  // A field atoll has no part for: accepted only at the value that means "off".
  void must_be(const std::string& k, const nlohmann::json& off, const std::string& why) {
    used.insert(k);
    if (has(k) && j.at(k) != off) refuse(k, why + " (fix: atoll imports it only as " + off.dump() + ")");
  }
};

// ZAYA1's RoPE (ckpt/export_zaya.cc hf_zaya_config_json): layer_types "hybrid" (global) or
// "hybrid_sliding" (local, its own rope_theta), rope_parameters per type with one
// partial_rotary_factor. The sliding window of local layers must keep the whole context.
void zaya_rope(Reader& r, ModelConfig& m) {
  r.used.insert("layer_types"), r.used.insert("rope_parameters");
  const auto& j = r.j;
  if (!r.has("rope_parameters") || !j["rope_parameters"].is_object() || !j["rope_parameters"].contains("hybrid"))
    r.refuse("rope_parameters", "ZAYA1's config gives the RoPE of its \"hybrid\" layers there");
  double factor = -1;
  for (const auto& [type, p] : j["rope_parameters"].items()) {
    if ((type != "hybrid" && type != "hybrid_sliding") || !p.is_object() || p.value("rope_type", "default") != "default" ||
        !p.contains("rope_theta") || !p["rope_theta"].is_number())
      r.refuse("rope_parameters", "atoll models the default RoPE of layer types hybrid and hybrid_sliding only");
    const double f = p.value("partial_rotary_factor", 1.0);
    if (factor >= 0 && f != factor) r.refuse("rope_parameters", "atoll has one partial_rotary_factor for every layer");
    factor = f;
    (type == "hybrid" ? m.rope_theta : m.rope_theta_local) = p["rope_theta"].get<double>();
  }
  m.partial_rotary_factor = factor;
  if (r.has("layer_types")) {
    if (!j["layer_types"].is_array() || j["layer_types"].size() != size_t(m.n_layers)) r.refuse("layer_types", "not one per layer");
    bool local = false;
    for (const auto& t : j["layer_types"]) {
      if (t != "hybrid" && t != "hybrid_sliding") r.refuse("layer_types", "atoll models hybrid and hybrid_sliding layers");
      local = local || t == "hybrid_sliding";
      m.rope_layers.push_back(t == "hybrid" ? "global" : "local");
    }
    if (!local) m.rope_layers.clear();
    else if (!r.has("sliding_window") || !j["sliding_window"].is_number_integer() ||
             j["sliding_window"].get<int64_t>() < m.seq_len)
      r.refuse("sliding_window", "atoll's local layers see the whole context: the window must be model.seq_len or more");
  }
}

// Qwen3-MoE's and Qwen2-MoE's choice of layers: every layer sparse (decoder_sparse_step 1, no
// mlp_only_layers; a dense MLP layer of intermediate_size is not modelled, so intermediate_size is
// then unused), full attention everywhere: use_sliding_window false, which leaves sliding_window
// and max_window_layers unused, or true with a sliding_window of model.seq_len or more (a window
// that holds the whole training context is full attention).
void qwen_layers(Reader& r, const ModelConfig& m, HfSource& src) {
  const auto& j = r.j;
  r.used.insert("decoder_sparse_step"), r.used.insert("mlp_only_layers"), r.used.insert("layer_types");
  if (r.has("decoder_sparse_step") && j["decoder_sparse_step"] != 1)
    r.refuse("decoder_sparse_step", "atoll models every layer as an MoE layer (fix: a model with decoder_sparse_step 1)");
  if (r.has("mlp_only_layers") && (!j["mlp_only_layers"].is_array() || !j["mlp_only_layers"].empty()))
    r.refuse("mlp_only_layers", "atoll has no dense MLP layers between MoE layers");
  r.used.insert("use_sliding_window");
  if (r.has("use_sliding_window") && !j["use_sliding_window"].is_boolean())
    r.refuse("use_sliding_window", "not true or false");
  const bool sliding = r.has("use_sliding_window") && j["use_sliding_window"].get<bool>();
  const bool window_holds_context = r.has("sliding_window") && j["sliding_window"].is_number_integer() &&
                                    j["sliding_window"].get<int64_t>() >= m.seq_len;
  if (sliding && !window_holds_context)
    r.refuse("use_sliding_window", "atoll's attention sees the whole context, and sliding_window = " +
                                       (j.contains("sliding_window") ? j["sliding_window"].dump() : "(missing)") +
                                       " is shorter than model.seq_len = " + std::to_string(m.seq_len) +
                                       " (fix: --set model.seq_len to the window or less)");
  if (r.has("layer_types")) {
    if (!j["layer_types"].is_array() || j["layer_types"].size() != size_t(m.n_layers))
      r.refuse("layer_types", "not one per layer");
    for (const auto& t : j["layer_types"])
      if (t != "full_attention" && !(t == "sliding_attention" && window_holds_context))
        r.refuse("layer_types", "atoll models full_attention layers only (or sliding_attention with a sliding_window "
                                "of model.seq_len or more)");
  }
  for (const char* k : {"intermediate_size", "sliding_window", "max_window_layers"})
    if (j.contains(k)) r.used.insert(k), src.ignored.push_back(k);
}

// Qwen2-MoE's own fields: the shared expert's width (transformers' default 5632 when absent) and
// the q/k/v biases (qkv_bias; transformers' default true, and released configs leave it out).
void qwen2_fields(Reader& r, ModelConfig& m) {
  m.shared_expert_hidden = r.integer("shared_expert_intermediate_size", 5632, false);
  r.used.insert("qkv_bias");
  if (r.has("qkv_bias") && !r.j["qkv_bias"].is_boolean()) r.refuse("qkv_bias", "not true or false");
  m.qkv_bias = !r.has("qkv_bias") || r.j["qkv_bias"].get<bool>();
}

// config.json's fields -> src (read_hf_config parses the file and turns JSON type errors into
// ConfigErrors).
HfSource interpret_hf_config(const nlohmann::json& j, const std::string& path, const ModelConfig& base, HfSource src) {
  Reader r{j, path, {}};
  const std::string type = r.has("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  std::string arch;
  for (const auto& [t, a] : kArchitectures)
    if (type == t) arch = a;
  if (arch.empty())
    throw ConfigError(path + ": unknown model_type " + (j.contains("model_type") ? j["model_type"].dump() : "(missing)") +
                      "; atoll imports mixtral (MixtralForCausalLM), qwen3_moe (Qwen3MoeForCausalLM), qwen2_moe "
                      "(Qwen2MoeForCausalLM), olmoe (OlmoeForCausalLM), zaya (ZayaForCausalLM), llama and mistral (as "
                      "one expert, top-1)");
  const bool moe = type == "mixtral", zaya = type == "zaya", qwen3 = type == "qwen3_moe", olmoe = type == "olmoe";
  const bool qwen2 = type == "qwen2_moe";
  if (j.contains("architectures")) {
    const auto& a = j["architectures"];
    if (!a.is_array() || a.size() != 1 || a[0] != arch)
      r.refuse("architectures", "model_type " + type + " is imported as [\"" + arch + "\"] only");
  }
  src.architecture = arch;
  ModelConfig m = base;
  m.vocab_size = r.integer("vocab_size", 0, true);
  m.dim = r.integer("hidden_size", 0, true);
  m.expert_hidden = r.integer(zaya || qwen3 || qwen2 ? "moe_intermediate_size" : "intermediate_size", 0, true);
  m.n_layers = r.integer("num_hidden_layers", 0, true);
  m.n_heads = r.integer("num_attention_heads", 0, true);
  // transformers' defaults where a field may be absent: MixtralConfig's and LlamaConfig's.
  m.n_kv_heads = r.integer("num_key_value_heads", moe ? 8 : qwen3 ? 4 : qwen2 ? 16 : m.n_heads, false);
  if (m.dim % m.n_heads != 0 && !r.has("head_dim")) r.refuse("head_dim", "hidden_size is not a multiple of the heads");
  m.head_dim = r.integer("head_dim", m.dim / m.n_heads, false);
  if ((olmoe || qwen2) && m.head_dim * m.n_heads != m.dim)
    r.refuse("head_dim", std::string(olmoe ? "OLMoE" : "Qwen2-MoE") +
                             "'s heads are hidden_size / num_attention_heads wide whatever head_dim says");
  if (zaya) {
    m.n_experts = r.integer("num_experts", 0, true);
    m.top_k = r.integer("num_experts_per_tok", 1, false);
    if (m.top_k != 1) r.refuse("num_experts_per_tok", "atoll's zaya router picks one expert");
    m.router_hidden_size = r.integer("router_hidden_size", 0, true);
    m.cca_time0 = r.integer("cca_time0", 2, false);
    m.cca_time1 = r.integer("cca_time1", 2, false);
  } else if (moe) {
    m.n_experts = r.integer("num_local_experts", 0, true);
    m.top_k = r.integer("num_experts_per_tok", 0, true);
  } else if (qwen3 || olmoe || qwen2) {
    m.n_experts = r.integer("num_experts", 0, true);
    m.top_k = r.integer("num_experts_per_tok", 0, true);
  } else {
    m.n_experts = 1, m.top_k = 1;
  }
  m.rope_theta = r.number("rope_theta", moe ? 1e6 : 1e4);
  m.attention = "gqa", m.router = "topk", m.attention_layers.clear(), m.router_layers.clear(), m.rope_layers.clear();
  m.partial_rotary_factor = 1.0, m.residual_scaling = false;
  m.qk_norm = qwen3 ? "head" : olmoe ? "proj" : "none";
  m.router_renormalize = true;
  m.qkv_bias = false, m.shared_expert_hidden = 0;
  if (qwen3 || olmoe || qwen2) {  // transformers' default: false (Qwen3-MoE's released configs say true)
    r.used.insert("norm_topk_prob");
    if (r.has("norm_topk_prob") && !j["norm_topk_prob"].is_boolean()) r.refuse("norm_topk_prob", "not true or false");
    m.router_renormalize = r.has("norm_topk_prob") && j["norm_topk_prob"].get<bool>();
  }
  if (olmoe) r.must_be("clip_qkv", nullptr, "atoll does not clamp q, k and v");
  if (qwen3 || qwen2) qwen_layers(r, m, src);
  if (qwen2) qwen2_fields(r, m);
  if (zaya) {
    zaya_rope(r, m);
    m.attention = "cca", m.router = "zaya", m.residual_scaling = true;  // the export writes identity scales without
    r.must_be("lm_head_bias", false, "atoll's head has no bias");
  } else if (r.has("rope_parameters")) {  // transformers v5 keeps the RoPE settings together
    r.used.insert("rope_parameters");
    const auto& p = j["rope_parameters"];
    if (!p.is_object() || p.value("rope_type", std::string("default")) != "default" || !p.contains("rope_theta") ||
        !p["rope_theta"].is_number() || p.size() > 2)
      r.refuse("rope_parameters", "atoll's RoPE is the default one with a rope_theta; scaled RoPE is not modelled");
    m.rope_theta = p["rope_theta"].get<double>();
  }
  m.norm_eps = r.number("rms_norm_eps", moe || olmoe ? 1e-5 : 1e-6);
  r.used.insert("tie_word_embeddings");
  if (r.has("tie_word_embeddings") && !j["tie_word_embeddings"].is_boolean())
    r.refuse("tie_word_embeddings", "not true or false");
  m.tie_embeddings = r.has("tie_word_embeddings") && j["tie_word_embeddings"].get<bool>();
  const int max_pos = r.integer("max_position_embeddings", m.seq_len, false);
  if (m.seq_len > max_pos)
    throw ConfigError(path + ": max_position_embeddings = " + std::to_string(max_pos) + " is shorter than model.seq_len = " +
                      std::to_string(m.seq_len) + " (fix: --set model.seq_len=" + std::to_string(max_pos) + " or less)");
  r.must_be("hidden_act", "silu", "atoll's experts use SiLU (SwiGLU) only");
  r.must_be("attention_dropout", 0.0, "atoll has no dropout");
  r.must_be("router_jitter_noise", 0.0, "atoll's router adds no jitter noise");
  r.must_be("attention_bias", false, "atoll's projections have no bias");
  r.must_be("mlp_bias", false, "atoll's experts have no bias");
  r.must_be("rope_scaling", nullptr, "atoll's RoPE is not scaled");
  r.must_be("partial_rotary_factor", 1.0, "Mixtral and Llama rotate every entry of each head");
  const bool window_unused = r.used.count("sliding_window");  // Qwen's: qwen_layers decided
  r.used.insert("sliding_window");
  if (!window_unused && r.has("sliding_window") && !(zaya && m.any_rope_local()) && (!j["sliding_window"].is_number_integer() || j["sliding_window"].get<int64_t>() < m.seq_len))
    r.refuse("sliding_window", "atoll's attention sees the whole context; a window shorter than model.seq_len = " +
                                   std::to_string(m.seq_len) + " is not modelled (fix: --set model.seq_len to the window or less)");
  for (const auto& [k, v] : j.items()) {
    if (kNoEffect.count(k)) src.ignored.push_back(k);
    else if (!r.used.count(k))
      r.refuse(k, "atoll does not know this field, so it cannot tell whether the model it describes is atoll's "
                  "(fix: remove it from config.json if it does not change the forward pass)");
  }
  src.model = m;
  return src;
}

}  // namespace

HfSource read_hf_config(const std::string& dir, const ModelConfig& base, HfSource src) {
  const std::string path = (fs::path(dir) / "config.json").string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(path + " is not valid JSON (" + e.what() + "); fix: pass a Hugging Face model folder");
  }
  if (!j.is_object()) throw ConfigError(path + " is not a JSON object; fix: pass a Hugging Face model folder");
  // A field of another type than transformers writes (e.g. a number where a name belongs)
  // surfaces as nlohmann's type_error wherever a check above did not name it first.
  try {
    return interpret_hf_config(j, path, base, std::move(src));
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(path + ": a field has the wrong type (" + e.what() +
                      "); fix: config.json as transformers writes it for the model");
  }
}

}  // namespace atl
