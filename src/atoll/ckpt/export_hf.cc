#include "atoll/ckpt/export_hf.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>

#include "atoll/ckpt/export_zaya.h"
#include "atoll/ckpt/file_io.h"
#include "atoll/ckpt/hf_tables.h"
#include "atoll/ckpt/safetensors.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/core/stale_temp.h"

namespace fs = std::filesystem;

namespace atl {
namespace {

// The export's record of the files atoll wrote into it (kExportRecord itself aside): what a
// later export may replace. Every other file in the folder is the user's and is kept.
constexpr const char* kExportRecord = "atoll-export.json";
constexpr const char* kGenerationConfig = "generation_config.json";
constexpr const char* kRecordFormat = "atoll-export-1";
// What exports made before the record existed wrote.
const std::set<std::string> kLegacyExportFiles = {"config.json", "model.safetensors", "tokenizer.model"};
// Every name an export writes (the record aside). Only these, as plain files, may ever be
// replaced: a record that lists anything else (edited by hand, or not atoll's) names the user's
// files, which are kept.
const std::set<std::string> kExportFiles = {"config.json", "model.safetensors", "tokenizer.model",
                                            "tokenizer_config.json", kGenerationConfig};

// An export made before the record existed: config.json naming MixtralForCausalLM beside
// model.safetensors.
bool is_legacy_export(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir / "model.safetensors", ec)) return false;
  try {
    auto cfg = nlohmann::json::parse(read_text_file((dir / "config.json").string()));
    const auto& arch = cfg.at("architectures");
    return std::find(arch.begin(), arch.end(), "MixtralForCausalLM") != arch.end();
  } catch (const std::exception&) {
    return false;
  }
}

// The files atoll wrote into `dir` by its record, or nullopt when it has no valid one.
std::optional<std::set<std::string>> recorded_files(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir / kExportRecord, ec)) return std::nullopt;
  try {
    const auto rec = nlohmann::json::parse(read_text_file((dir / kExportRecord).string()));
    if (rec.at("format") != kRecordFormat) return std::nullopt;
    return rec.at("files").get<std::set<std::string>>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 5; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > 5) s += " and " + std::to_string(names.size() - 5) + " more";
  return s;
}

// The entries of an existing `out_dir` that the new export keeps (the user's), after checking
// that the export replaces only files atoll wrote: `out_dir` is missing, empty, or an earlier
// export (its record, or the legacy files) none of whose user files has a name the new export
// writes. Anything else is refused with IoError naming the files and the fix.
std::vector<std::string> users_files(const fs::path& out_dir, const std::vector<std::string>& will_write) {
  std::error_code ec;
  if (!fs::exists(out_dir, ec)) return {};
  if (!fs::is_directory(out_dir, ec))
    throw IoError("export path " + out_dir.string() + " exists and is not a directory (fix: choose another --out)");
  std::vector<std::string> present;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) present.push_back(e.path().filename().string());
  if (ec) throw IoError("cannot list export directory " + out_dir.string() + ": " + ec.message());
  std::sort(present.begin(), present.end());
  if (present.empty()) return {};
  std::optional<std::set<std::string>> ours = recorded_files(out_dir);
  if (!ours && is_legacy_export(out_dir)) ours = kLegacyExportFiles;
  if (!ours)
    throw IoError("export directory " + out_dir.string() + " holds files atoll did not write (" + name_list(present) +
                  ") and no earlier export (no valid " + kExportRecord +
                  "); fix: choose a new --out directory, or move those files elsewhere");
  for (auto it = ours->begin(); it != ours->end();) {
    const fs::file_status st = fs::symlink_status(out_dir / *it, ec);
    if (kExportFiles.count(*it) && !fs::is_directory(st)) {
      ++it;
      continue;
    }
    if (fs::exists(st))
      log_warn((out_dir / kExportRecord).string() + " lists " + *it + ", which is not " +
               (kExportFiles.count(*it) ? "a file" : "a name atoll's export writes") + ": kept as yours, not replaced");
    it = ours->erase(it);
  }
  std::vector<std::string> theirs, clash;
  for (const std::string& name : present) {
    if (name == kExportRecord || ours->count(name)) continue;
    theirs.push_back(name);
    if (std::find(will_write.begin(), will_write.end(), name) != will_write.end()) clash.push_back(name);
  }
  if (!clash.empty())
    throw IoError("export directory " + out_dir.string() + " holds " + name_list(clash) +
                  ", which atoll did not write there (not in " + kExportRecord +
                  ") and this export would replace; fix: move it out of the folder, or choose another --out");
  return theirs;
}

// Brings the user's entry `name` of `from` into the new export folder `to`: hard links (no
// copy of the bytes; the old folder is removed after the rename), or a copy where the file
// system has none. Folders come whole; symbolic links stay links.
void carry_over(const fs::path& from, const fs::path& to, const std::string& name) {
  std::error_code ec;
  const auto opts = fs::copy_options::recursive | fs::copy_options::copy_symlinks;
  fs::copy(from / name, to / name, opts | fs::copy_options::create_hard_links, ec);
  if (!ec) return;
  fs::remove_all(to / name, ec);
  fs::copy(from / name, to / name, opts, ec);
  if (ec)
    throw IoError("cannot keep " + (from / name).string() + " in the new export: " + ec.message() +
                  " (fix: check its permissions, or move it out of the folder)");
}

}  // namespace

namespace {

// config.json of the four architectures whose blocks are gqa attention and the topk router: the
// field names and meanings of transformers' MixtralConfig, Qwen3MoeConfig, OlmoeConfig and
// Qwen2MoeConfig (its shared_expert_intermediate_size and qkv_bias; heads of hidden_size /
// num_attention_heads, as OLMoE's).
// intermediate_size is the hidden width of one expert (Qwen3-MoE's moe_intermediate_size; its
// intermediate_size, the width of a dense MLP layer, is unused: every layer sparse,
// decoder_sparse_step 1, no mlp_only_layers). No sliding window. OLMoE has no head_dim field (its
// heads are hidden_size / num_attention_heads) and Mixtral no norm_topk_prob (always renormalised).
std::string hf_topk_config_json(const ModelConfig& m, HfArchitecture arch) {
  const bool mixtral = arch == HfArchitecture::kMixtral, qwen3 = arch == HfArchitecture::kQwen3Moe;
  const bool qwen2 = arch == HfArchitecture::kQwen2Moe;
  nlohmann::ordered_json j = {
      {"architectures",
       {mixtral ? "MixtralForCausalLM" : qwen3 ? "Qwen3MoeForCausalLM" : qwen2 ? "Qwen2MoeForCausalLM" : "OlmoeForCausalLM"}},
      {"model_type", mixtral ? "mixtral" : qwen3 ? "qwen3_moe" : qwen2 ? "qwen2_moe" : "olmoe"},
      {"vocab_size", m.vocab_size},
      {"hidden_size", m.dim},
      {"intermediate_size", m.expert_hidden},
      {"num_hidden_layers", m.n_layers},
      {"num_attention_heads", m.n_heads},
      {"num_key_value_heads", m.n_kv_heads},
  };
  if (arch != HfArchitecture::kOlmoe && !qwen2) j["head_dim"] = m.head_dim;
  j[mixtral ? "num_local_experts" : "num_experts"] = m.n_experts;
  j["num_experts_per_tok"] = m.top_k;
  if (!mixtral) j["norm_topk_prob"] = m.router_renormalize;
  if (qwen2) {
    j["shared_expert_intermediate_size"] = m.shared_expert_hidden;
    j["qkv_bias"] = m.qkv_bias;
  }
  if (qwen3 || qwen2) {
    j["moe_intermediate_size"] = m.expert_hidden;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::ordered_json::array();
    j["use_sliding_window"] = false;
  }
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = m.seq_len;
  j["rope_theta"] = m.rope_theta;
  j["rms_norm_eps"] = m.norm_eps;
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["router_aux_loss_coef"] = m.aux_loss_coef;
  j["output_router_logits"] = false;
  if (arch == HfArchitecture::kOlmoe) j["clip_qkv"] = nullptr;
  else j["sliding_window"] = nullptr;
  if (!mixtral && !qwen2) j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = m.init_std;
  j["use_cache"] = true;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

}  // namespace

std::string hf_mixtral_config_json(const ModelConfig& m) { return hf_topk_config_json(m, HfArchitecture::kMixtral); }

namespace {

// transformers' LlamaTokenizer settings for a SentencePiece model as atoll uses it.
std::string hf_tokenizer_config_json(const ModelConfig& m, const HfSpecialTokens& t) {
  auto piece = [](int id, const std::string& p) { return id >= 0 ? nlohmann::ordered_json(p) : nlohmann::ordered_json(); };
  const nlohmann::ordered_json j = {
      {"tokenizer_class", "LlamaTokenizer"},
      {"add_bos_token", false},
      {"add_eos_token", false},
      {"add_prefix_space", false},
      {"legacy", false},
      {"bos_token", piece(t.bos, t.bos_piece)},
      {"eos_token", piece(t.eos, t.eos_piece)},
      {"unk_token", piece(t.unk, t.unk_piece)},
      {"pad_token", piece(t.pad, t.pad_piece)},
      {"model_max_length", m.seq_len},
      {"clean_up_tokenization_spaces", false},
      {"spaces_between_special_tokens", false},
  };
  return j.dump(2) + "\n";
}

std::string with_special_ids(const std::string& config_json, const HfSpecialTokens& t) {
  auto j = nlohmann::ordered_json::parse(config_json);
  auto id = [](int v) { return v >= 0 ? nlohmann::ordered_json(v) : nlohmann::ordered_json(); };
  j["bos_token_id"] = id(t.bos);
  j["eos_token_id"] = id(t.eos);
  j["pad_token_id"] = id(t.pad);
  return j.dump(2) + "\n";
}

// generation_config.json: the special ids, written into the export's existing one when there is
// one (the user's sampling settings kept, the ids replaced), else on their own. Its other keys
// belong to the user, so it is merged rather than replaced, and is never a clash.
std::string merged_generation_config(const fs::path& existing, const HfSpecialTokens& t) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  std::error_code ec;
  if (fs::exists(existing, ec)) {
    std::ifstream f(existing);
    j = nlohmann::ordered_json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object())
      throw IoError(existing.string() + " is not a JSON object, so the export cannot add the special token ids to it "
                    "(fix: correct or remove the file)");
  }
  auto id = [](int v) { return v >= 0 ? nlohmann::ordered_json(v) : nlohmann::ordered_json(); };
  j["bos_token_id"] = id(t.bos);
  j["eos_token_id"] = id(t.eos);
  j["pad_token_id"] = id(t.pad);
  return j.dump(2) + "\n";
}

}  // namespace

void export_hf(const std::string& out_dir, const ModelConfig& m, const ParamLayout& layout, const float* params,
               const std::string& tokenizer_path, const HfSpecialTokens& special) {
  ATOLL_CHECK_EQ(layout.total(), ParamLayout::build(m).total()) << "layout does not match the model config";
  ATOLL_CHECK_EQ(layout.find("head") == nullptr, m.tie_embeddings) << "layout and model.tie_embeddings disagree";
  fs::path final_dir = fs::absolute(out_dir).lexically_normal();
  if (!final_dir.has_filename()) final_dir = final_dir.parent_path();  // "out/" -> "out"
  std::vector<std::string> written = {"model.safetensors", "config.json"};
  if (!tokenizer_path.empty()) written.push_back("tokenizer.model");
  const HfArchitecture arch = hf_architecture(m);  // refuses a mix neither architecture expresses
  // Mixtral's rotary embedding turns every entry of a head; a partial one would export a
  // different model under the same tensors (ZAYA1's config carries partial_rotary_factor).
  if (arch != HfArchitecture::kZaya && m.partial_rotary_factor != 1.0)
    throw Error("cannot export model.partial_rotary_factor = " + std::to_string(m.partial_rotary_factor) +
                " as Mixtral: transformers' Mixtral rotates every entry of each head (fix: train with "
                "model.partial_rotary_factor = 1.0 to export as Mixtral)");
  if ((arch == HfArchitecture::kOlmoe || arch == HfArchitecture::kQwen2Moe) && m.head_dim * m.n_heads != m.dim)
    throw Error("cannot export model.head_dim = " + std::to_string(m.head_dim) + " as " +
                (arch == HfArchitecture::kOlmoe ? "OLMoE" : "Qwen2-MoE") + ": its heads are " +
                "hidden_size / num_attention_heads = " + std::to_string(m.dim / m.n_heads) +
                " wide (fix: train with model.head_dim * model.n_heads = model.dim)");
  const bool special_ids = !tokenizer_path.empty() && special.given();
  if (special_ids) written.push_back("tokenizer_config.json");
  for (const std::string& name : written) ATOLL_CHECK(kExportFiles.count(name)) << name << " is missing from kExportFiles";
  std::vector<std::string> keep = users_files(final_dir, written);
  // generation_config.json is merged (merged_generation_config), not carried over or refused.
  std::string generation_config;
  if (special_ids) {
    generation_config = merged_generation_config(final_dir / kGenerationConfig, special);
    std::erase(keep, std::string(kGenerationConfig));
    written.push_back(kGenerationConfig);
  }
  std::vector<TensorToWrite> tensors;
  std::vector<HfValues> zaya;  // ZAYA1's tensors are copies (its experts are re-packed)
  if (arch == HfArchitecture::kZaya) {
    zaya = hf_zaya_tensors(m, layout, params);
    for (const HfValues& t : zaya)
      tensors.push_back({t.name, "F32", t.shape, t.values.data(), t.values.size() * sizeof(float)});
  } else {
    const bool qwen_names =
        arch == HfArchitecture::kQwen3Moe || arch == HfArchitecture::kOlmoe || arch == HfArchitecture::kQwen2Moe;
    for (const auto& t : hf_mixtral_tensors(layout, qwen_names ? HfExpertLayout::kPerExpertMlp : HfExpertLayout::kPerExpert)) {
      size_t numel = 1;
      for (int64_t d : t.shape) numel *= static_cast<size_t>(d);
      tensors.push_back({t.name, "F32", t.shape, params + t.offset, numel * sizeof(float)});
    }
  }
  const std::string config_json = arch == HfArchitecture::kZaya ? hf_zaya_config_json(m) : hf_topk_config_json(m, arch);
  const fs::path tmp = final_dir.parent_path() / (final_dir.filename().string() + ".tmp-" + std::to_string(::getpid()));
  // An export killed before its rename (Ctrl-C, kill -9) left its OUT.tmp-PID, the size of the model.
  remove_stale_temps(final_dir.parent_path().string(), final_dir.filename().string(), "export");
  remove_all(tmp.string());
  make_dirs(tmp.string());
  try {
    // transformers refuses safetensors files whose metadata lacks a known "format".
    write_safetensors((tmp / "model.safetensors").string(), tensors, {.metadata = {{"format", "pt"}}});
    write_text_file((tmp / "config.json").string(), special_ids ? with_special_ids(config_json, special) : config_json,
                    /*sync=*/true);
    if (special_ids) {
      write_text_file((tmp / "tokenizer_config.json").string(), hf_tokenizer_config_json(m, special), /*sync=*/true);
      write_text_file((tmp / kGenerationConfig).string(), generation_config, /*sync=*/true);
    }
    if (!tokenizer_path.empty()) {
      std::error_code ec;
      fs::copy_file(tokenizer_path, tmp / "tokenizer.model", ec);
      if (ec) throw IoError("cannot copy " + tokenizer_path + " into the export: " + ec.message());
    }
    const nlohmann::ordered_json record = {{"format", kRecordFormat}, {"files", written}};
    write_text_file((tmp / kExportRecord).string(), record.dump(2) + "\n", /*sync=*/true);
    for (const std::string& name : keep) carry_over(final_dir, tmp, name);
    fsync_dir(tmp.string());
    publish_dir(tmp.string(), final_dir.string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace atl
