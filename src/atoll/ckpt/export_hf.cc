#include "atoll/ckpt/export_hf.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "atoll/ckpt/file_io.h"
#include "atoll/ckpt/safetensors.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"

namespace fs = std::filesystem;

namespace atl {
namespace {

// Our name (within a block, after "layers.{i}.") -> the Mixtral name after
// "model.layers.{i}.". Stacked expert tensors name "{e}" and are split along dim 0.
struct HfName {
  const char* ours;
  const char* theirs;
};
constexpr HfName kBlockNames[] = {
    {"attn_norm", "input_layernorm.weight"},
    {"attn.wq", "self_attn.q_proj.weight"},
    {"attn.wk", "self_attn.k_proj.weight"},
    {"attn.wv", "self_attn.v_proj.weight"},
    {"attn.wo", "self_attn.o_proj.weight"},
    {"moe_norm", "post_attention_layernorm.weight"},
    {"moe.router", "block_sparse_moe.gate.weight"},
    {"moe.w1", "block_sparse_moe.experts.{e}.w1.weight"},
    {"moe.w2", "block_sparse_moe.experts.{e}.w2.weight"},
    {"moe.w3", "block_sparse_moe.experts.{e}.w3.weight"},
};
constexpr HfName kTopNames[] = {
    {"embed", "model.embed_tokens.weight"},
    {"final_norm", "model.norm.weight"},
    {"head", "lm_head.weight"},
};

std::string hf_name_of(const ParamEntry& e) {
  for (const auto& n : kTopNames)
    if (e.name == n.ours) return n.theirs;
  const std::string pre = "layers." + std::to_string(e.layer) + ".";
  if (e.layer >= 0 && e.name.compare(0, pre.size(), pre) == 0)
    for (const auto& n : kBlockNames)
      if (e.name.substr(pre.size()) == n.ours) return "model." + pre + n.theirs;
  throw Error("cannot export parameter '" + e.name + "' as Mixtral: transformers has no tensor for it" +
              " (fix: export this architecture under its own name)");
}

// A previous export may be replaced; anything else non-empty is someone's data.
bool is_previous_export(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / "model.safetensors", ec)) return false;
  try {
    auto cfg = nlohmann::json::parse(read_text_file((fs::path(dir) / "config.json").string()));
    const auto& arch = cfg.at("architectures");
    return std::find(arch.begin(), arch.end(), "MixtralForCausalLM") != arch.end();
  } catch (const std::exception&) {
    return false;
  }
}

void check_out_dir(const std::string& out_dir) {
  std::error_code ec;
  if (!fs::exists(out_dir, ec)) return;
  if (!fs::is_directory(out_dir, ec))
    throw IoError("export path " + out_dir + " exists and is not a directory (fix: choose another --out)");
  if (fs::is_empty(out_dir, ec) || is_previous_export(out_dir)) return;
  throw IoError("export directory " + out_dir + " is not empty and holds no previous Mixtral export" +
                " (fix: choose a new --out directory or empty this one)");
}

}  // namespace

std::vector<HfTensor> hf_mixtral_tensors(const ParamLayout& layout) {
  std::vector<HfTensor> out;
  for (const auto& e : layout.entries()) {
    const std::string name = hf_name_of(e);
    const size_t brace = name.find("{e}");
    if (brace == std::string::npos) {
      out.push_back({name, e.shape, e.offset});
      continue;
    }
    // [E, out, in] -> E matrices [out, in], each contiguous in the stacked tensor.
    ATOLL_CHECK_EQ(e.shape.size(), size_t(3)) << e.name;
    const size_t per_expert = e.numel / static_cast<size_t>(e.shape[0]);
    for (int64_t x = 0; x < e.shape[0]; ++x) {
      std::string n = name;
      n.replace(brace, 3, std::to_string(x));
      out.push_back({n, {e.shape[1], e.shape[2]}, e.offset + static_cast<size_t>(x) * per_expert});
    }
  }
  return out;
}

std::string hf_mixtral_config_json(const ModelConfig& m) {
  // Field names and meanings of transformers' MixtralConfig; intermediate_size is the
  // hidden width of one expert.
  nlohmann::ordered_json j = {
      {"architectures", {"MixtralForCausalLM"}},
      {"model_type", "mixtral"},
      {"vocab_size", m.vocab_size},
      {"hidden_size", m.dim},
      {"intermediate_size", m.expert_hidden},
      {"num_hidden_layers", m.n_layers},
      {"num_attention_heads", m.n_heads},
      {"num_key_value_heads", m.n_kv_heads},
      {"head_dim", m.head_dim},
      {"num_local_experts", m.n_experts},
      {"num_experts_per_tok", m.top_k},
      {"hidden_act", "silu"},
      {"max_position_embeddings", m.seq_len},
      {"rope_theta", m.rope_theta},
      {"rms_norm_eps", m.norm_eps},
      {"tie_word_embeddings", m.tie_embeddings},
      {"router_aux_loss_coef", m.aux_loss_coef},
      {"output_router_logits", false},
      {"sliding_window", nullptr},
      {"attention_dropout", 0.0},
      {"initializer_range", m.init_std},
      {"use_cache", true},
      {"torch_dtype", "float32"},
  };
  return j.dump(2) + "\n";
}

void export_hf(const std::string& out_dir, const ModelConfig& m, const ParamLayout& layout, const float* params) {
  ATOLL_CHECK_EQ(layout.total(), ParamLayout::build(m).total()) << "layout does not match the model config";
  ATOLL_CHECK_EQ(layout.find("head") == nullptr, m.tie_embeddings) << "layout and model.tie_embeddings disagree";
  check_out_dir(out_dir);
  std::vector<TensorToWrite> tensors;
  for (const auto& t : hf_mixtral_tensors(layout)) {
    size_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<size_t>(d);
    tensors.push_back({t.name, "F32", t.shape, params + t.offset, numel * sizeof(float)});
  }
  fs::path final_dir = fs::absolute(out_dir).lexically_normal();
  if (!final_dir.has_filename()) final_dir = final_dir.parent_path();  // "out/" -> "out"
  const std::string tmp = (final_dir.parent_path() / (final_dir.filename().string() + ".tmp-" + std::to_string(::getpid()))).string();
  remove_all(tmp);
  make_dirs(tmp);
  try {
    // transformers refuses safetensors files whose metadata lacks a known "format".
    write_safetensors(tmp + "/model.safetensors", tensors, {.metadata = {{"format", "pt"}}});
    write_text_file(tmp + "/config.json", hf_mixtral_config_json(m), /*sync=*/true);
    fsync_dir(tmp);
    publish_dir(tmp, final_dir.string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace atl
