#include "atoll/ckpt/export_hf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "atoll/ckpt/file_io.h"
#include "atoll/ckpt/safetensors.h"
#include "atoll/core/errors.h"
#include "ckpt/ckpt_test_util.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using Shape = std::vector<int64_t>;
using testing::ScratchDir;

// The Mixtral tensors of testing::small_model(), written out by hand from transformers'
// MixtralForCausalLM (an oracle independent of the mapping under test).
std::map<std::string, Shape> expected_mixtral(bool tied) {
  const int64_t V = 64, C = 16, QD = 16, KVD = 8, E = 4, H = 24;
  std::map<std::string, Shape> want = {{"model.embed_tokens.weight", {V, C}}, {"model.norm.weight", {C}}};
  if (!tied) want["lm_head.weight"] = {V, C};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    want[p + "input_layernorm.weight"] = {C};
    want[p + "post_attention_layernorm.weight"] = {C};
    want[p + "self_attn.q_proj.weight"] = {QD, C};
    want[p + "self_attn.k_proj.weight"] = {KVD, C};
    want[p + "self_attn.v_proj.weight"] = {KVD, C};
    want[p + "self_attn.o_proj.weight"] = {C, QD};
    want[p + "block_sparse_moe.gate.weight"] = {E, C};
    for (int e = 0; e < E; ++e) {
      const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      want[x + "w1.weight"] = {H, C};
      want[x + "w3.weight"] = {H, C};
      want[x + "w2.weight"] = {C, H};
    }
  }
  return want;
}

struct Exported {
  ModelConfig m;
  ParamLayout layout;
  std::vector<float> params;
  SafetensorsReader file;
  nlohmann::json config;
};

Exported export_small(const std::string& out, bool tied) {
  ModelConfig m = testing::small_model(tied);
  ParamLayout layout = ParamLayout::build(m);
  std::vector<float> params = testing::pattern(layout.total(), 3);
  export_hf(out, m, layout, params.data());
  return {m, layout, params, SafetensorsReader::open(out + "/model.safetensors"),
          nlohmann::json::parse(read_text_file(out + "/config.json"))};
}

void expect_exact_names_and_shapes(const Exported& x, bool tied) {
  std::map<std::string, Shape> got;
  for (const auto& t : x.file.header().tensors) {
    EXPECT_EQ(t.dtype, "F32") << t.name;
    got[t.name] = t.shape;
  }
  EXPECT_EQ(got, expected_mixtral(tied));
  EXPECT_EQ(x.file.header().metadata.at("format"), "pt");
}

TEST(ExportHf, UntiedModelHasExactlyTheMixtralTensors) {
  ScratchDir dir;
  Exported x = export_small(dir / "hf", /*tied=*/false);
  expect_exact_names_and_shapes(x, false);
  EXPECT_EQ(x.config["tie_word_embeddings"], false);
}

TEST(ExportHf, TiedModelOmitsTheHead) {
  ScratchDir dir;
  Exported x = export_small(dir / "hf", /*tied=*/true);
  expect_exact_names_and_shapes(x, true);
  EXPECT_EQ(x.config["tie_word_embeddings"], true);
}

TEST(ExportHf, ConfigJsonDescribesTheModel) {
  ScratchDir dir;
  Exported x = export_small(dir / "hf", false);
  const auto& c = x.config;
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(c["model_type"], "mixtral");
  EXPECT_EQ(c["vocab_size"], 64);
  EXPECT_EQ(c["hidden_size"], 16);
  EXPECT_EQ(c["intermediate_size"], 24);
  EXPECT_EQ(c["num_hidden_layers"], 2);
  EXPECT_EQ(c["num_attention_heads"], 2);
  EXPECT_EQ(c["num_key_value_heads"], 1);
  EXPECT_EQ(c["head_dim"], 8);
  EXPECT_EQ(c["num_local_experts"], 4);
  EXPECT_EQ(c["num_experts_per_tok"], 2);
  EXPECT_EQ(c["max_position_embeddings"], 32);
  EXPECT_EQ(c["hidden_act"], "silu");
  EXPECT_EQ(c["rope_theta"].get<double>(), x.m.rope_theta);
  EXPECT_EQ(c["rms_norm_eps"].get<double>(), x.m.norm_eps);
  EXPECT_EQ(c["router_aux_loss_coef"].get<double>(), x.m.aux_loss_coef);
  EXPECT_EQ(c["initializer_range"].get<double>(), x.m.init_std);
  EXPECT_TRUE(c["sliding_window"].is_null());
  EXPECT_EQ(c["torch_dtype"], "float32");
}

// Element [r][k] of expert e's matrix equals the stacked tensor's [e][r][k]; and the plain
// tensors are the same bytes as their layout entries.
TEST(ExportHf, ExpertSlicesAndTensorsHoldTheRightValues) {
  ScratchDir dir;
  Exported x = export_small(dir / "hf", false);
  const ParamEntry& w2 = x.layout.at("layers.1.moe.w2");  // [E, C, H]
  const int64_t C = w2.shape[1], H = w2.shape[2];
  std::vector<float> slice(static_cast<size_t>(C * H));
  x.file.copy_to("model.layers.1.block_sparse_moe.experts.1.w2.weight", "F32", {C, H}, slice.data());
  for (int64_t r = 0; r < C; ++r)
    for (int64_t k = 0; k < H; ++k)
      ASSERT_EQ(slice[r * H + k], x.params[w2.offset + static_cast<size_t>((1 * C + r) * H + k)]) << r << "," << k;

  const ParamEntry& w1 = x.layout.at("layers.0.moe.w1");  // [E, H, C]
  std::vector<float> last(static_cast<size_t>(w1.shape[1] * w1.shape[2]));
  x.file.copy_to("model.layers.0.block_sparse_moe.experts.3.w1.weight", "F32", {w1.shape[1], w1.shape[2]}, last.data());
  EXPECT_EQ(0, std::memcmp(last.data(), x.params.data() + w1.offset + 3 * last.size(), last.size() * 4));

  for (auto [ours, theirs] : std::map<std::string, std::string>{{"embed", "model.embed_tokens.weight"},
                                                                 {"head", "lm_head.weight"},
                                                                 {"final_norm", "model.norm.weight"},
                                                                 {"layers.1.attn.wo", "model.layers.1.self_attn.o_proj.weight"},
                                                                 {"layers.0.moe.router", "model.layers.0.block_sparse_moe.gate.weight"},
                                                                 {"layers.1.moe_norm", "model.layers.1.post_attention_layernorm.weight"}}) {
    const ParamEntry& e = x.layout.at(ours);
    auto v = x.file.view(theirs);
    ASSERT_EQ(v.size(), e.numel * 4) << theirs;
    EXPECT_EQ(0, std::memcmp(v.data(), x.params.data() + e.offset, v.size())) << theirs;
  }
}

TEST(ExportHf, ReplacesAPreviousExportButNotOtherData) {
  ScratchDir dir;
  export_small(dir / "hf", false);
  EXPECT_NO_THROW(export_small(dir / "hf", true));  // a previous export is replaced
  EXPECT_FALSE(SafetensorsReader::open(dir / "hf/model.safetensors").find("lm_head.weight"));

  fs::create_directories(dir / "empty");
  EXPECT_NO_THROW(export_small(dir / "empty", false));

  fs::create_directories(dir / "mine");
  std::ofstream(dir / "mine/notes.txt") << "keep me";
  try {
    export_small(dir / "mine", false);
    FAIL() << "overwrote a directory holding other data";
  } catch (const IoError& e) {
    EXPECT_TRUE(testing::has(e.what(), "mine")) << e.what();
  }
  EXPECT_EQ(read_text_file(dir / "mine/notes.txt"), "keep me");
  // No temporary directories are left beside the outputs.
  for (const auto& e : fs::directory_iterator(dir.str()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// Files the user put beside an export (a model card, a generation config, a folder of
// notes) survive an export over it: only what atoll wrote is replaced.
TEST(ExportHf, ExportingAgainKeepsTheFilesTheUserAdded) {
  ScratchDir dir;
  export_small(dir / "hf", /*tied=*/false);
  std::ofstream(dir / "hf/README.md") << "# my model\n";
  std::ofstream(dir / "hf/generation_config.json") << "{\"temperature\": 0.7}\n";
  fs::create_directories(dir / "hf/notes");
  std::ofstream(dir / "hf/notes/eval.txt") << "loss 3.1\n";
  export_small(dir / "hf", /*tied=*/true);
  EXPECT_EQ(read_text_file(dir / "hf/README.md"), "# my model\n");
  EXPECT_EQ(read_text_file(dir / "hf/generation_config.json"), "{\"temperature\": 0.7}\n");
  EXPECT_EQ(read_text_file(dir / "hf/notes/eval.txt"), "loss 3.1\n");
  EXPECT_FALSE(SafetensorsReader::open(dir / "hf/model.safetensors").find("lm_head.weight"));  // the new export
  for (const auto& e : fs::directory_iterator(dir.str()))
    EXPECT_EQ(e.path().filename().string(), "hf") << "left behind: " << e.path();
}

// atoll-export.json lists what atoll wrote; an export from before that record (config.json
// and model.safetensors, maybe tokenizer.model) is still recognised, and its user files kept.
TEST(ExportHf, TheRecordListsAtollsFilesAndOldExportsAreRecognised) {
  ScratchDir dir;
  std::ofstream(dir / "tokenizer.model") << "pieces";
  const ModelConfig m = testing::small_model(false);
  const ParamLayout layout = ParamLayout::build(m);
  const std::vector<float> params = testing::pattern(layout.total(), 3);
  export_hf(dir / "hf", m, layout, params.data(), dir / "tokenizer.model");
  const auto record = nlohmann::json::parse(read_text_file(dir / "hf/atoll-export.json"));
  EXPECT_EQ(record["files"].get<std::set<std::string>>(),
            (std::set<std::string>{"config.json", "model.safetensors", "tokenizer.model"}));
  EXPECT_EQ(read_text_file(dir / "hf/tokenizer.model"), "pieces");

  fs::remove(dir / "hf/atoll-export.json");  // as an older atoll left it
  std::ofstream(dir / "hf/README.md") << "card";
  export_hf(dir / "hf", m, layout, params.data());  // no tokenizer this time
  EXPECT_EQ(read_text_file(dir / "hf/README.md"), "card");
  EXPECT_FALSE(fs::exists(dir / "hf/tokenizer.model")) << "atoll's own stale file is not kept";
  EXPECT_TRUE(fs::exists(dir / "hf/atoll-export.json"));
}

// With the tokenizer's special ids, generation_config.json gets them too: written when absent,
// merged into the user's (their settings kept), and a user's file that is not a JSON object is
// refused with the export left as it was.
TEST(ExportHf, GenerationConfigGetsTheSpecialIds) {
  ScratchDir dir;
  std::ofstream(dir / "tokenizer.model") << "pieces";
  const ModelConfig m = testing::small_model(false);
  const ParamLayout layout = ParamLayout::build(m);
  const std::vector<float> params = testing::pattern(layout.total(), 3);
  const HfSpecialTokens special{.bos = 1, .eos = 2, .unk = 0, .bos_piece = "<s>", .eos_piece = "</s>", .unk_piece = "<unk>"};
  export_hf(dir / "hf", m, layout, params.data(), dir / "tokenizer.model", special);
  auto gen = nlohmann::json::parse(read_text_file(dir / "hf/generation_config.json"));
  EXPECT_EQ(gen, nlohmann::json::parse(R"({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": null})"));
  const auto record = nlohmann::json::parse(read_text_file(dir / "hf/atoll-export.json"));
  EXPECT_TRUE(record["files"].get<std::set<std::string>>().count("generation_config.json"));

  // The user's own settings, in a folder exported before (or beside a record that does not list it).
  std::ofstream(dir / "hf/generation_config.json") << R"({"temperature": 0.7, "eos_token_id": 99})";
  export_hf(dir / "hf", m, layout, params.data(), dir / "tokenizer.model", special);
  gen = nlohmann::json::parse(read_text_file(dir / "hf/generation_config.json"));
  EXPECT_EQ(gen["temperature"], 0.7);
  EXPECT_EQ(gen["eos_token_id"], 2) << "the ids are the tokenizer's";
  EXPECT_EQ(gen["bos_token_id"], 1);

  std::ofstream(dir / "hf/generation_config.json") << "[1, 2";
  const std::string config_before = read_text_file(dir / "hf/config.json");
  try {
    export_hf(dir / "hf", m, layout, params.data(), dir / "tokenizer.model", special);
    ADD_FAILURE() << "a broken generation_config.json was accepted";
  } catch (const IoError& e) {
    EXPECT_TRUE(testing::has(e.what(), "generation_config.json")) << e.what();
    EXPECT_TRUE(testing::has(e.what(), "fix")) << e.what();
  }
  EXPECT_EQ(read_text_file(dir / "hf/generation_config.json"), "[1, 2");
  EXPECT_EQ(read_text_file(dir / "hf/config.json"), config_before);
}

// A file under a name the export writes that atoll did not write there is never replaced.
TEST(ExportHf, RefusesToReplaceAFileAtollDidNotWrite) {
  ScratchDir dir;
  const ModelConfig m = testing::small_model(false);
  const ParamLayout layout = ParamLayout::build(m);
  const std::vector<float> params = testing::pattern(layout.total(), 3);
  export_hf(dir / "hf", m, layout, params.data());
  std::ofstream(dir / "hf/tokenizer.model") << "the user's own tokenizer";
  std::ofstream(dir / "tok.model") << "pieces";
  const std::string before = read_text_file(dir / "hf/model.safetensors");
  try {
    export_hf(dir / "hf", m, layout, params.data(), dir / "tok.model");
    FAIL() << "replaced a file atoll did not write";
  } catch (const IoError& e) {
    EXPECT_TRUE(testing::has(e.what(), "tokenizer.model")) << e.what();
    EXPECT_TRUE(testing::has(e.what(), "fix")) << e.what();
  }
  EXPECT_EQ(read_text_file(dir / "hf/tokenizer.model"), "the user's own tokenizer");
  EXPECT_EQ(read_text_file(dir / "hf/model.safetensors"), before);
}

// A record that lists more than an export writes (edited by hand, or not atoll's) never makes
// the export delete those names: a file, a folder (with what it holds) and a folder under one
// of the export's own names all stay as they were.
TEST(ExportHf, OnlyTheNamesAnExportWritesAreEverReplaced) {
  ScratchDir dir;
  export_small(dir / "hf", /*tied=*/false);
  std::ofstream(dir / "hf/thesis.txt") << "years of work";
  fs::create_directories(dir / "hf/mydata");
  std::ofstream(dir / "hf/mydata/a.txt") << "a";
  fs::create_directories(dir / "hf/tokenizer_config.json");  // a folder under an export's name
  std::ofstream(dir / "hf/tokenizer_config.json/b.txt") << "b";
  auto record = nlohmann::json::parse(read_text_file(dir / "hf/atoll-export.json"));
  for (const char* name : {"thesis.txt", "mydata", "tokenizer_config.json", ".", "../outside"})
    record["files"].push_back(name);
  std::ofstream(dir / "hf/atoll-export.json") << record.dump();
  export_small(dir / "hf", /*tied=*/false);
  EXPECT_EQ(read_text_file(dir / "hf/thesis.txt"), "years of work");
  EXPECT_EQ(read_text_file(dir / "hf/mydata/a.txt"), "a");
  EXPECT_EQ(read_text_file(dir / "hf/tokenizer_config.json/b.txt"), "b");
  EXPECT_TRUE(fs::exists(dir / "hf/model.safetensors"));
  // The new record lists only what this export wrote.
  record = nlohmann::json::parse(read_text_file(dir / "hf/atoll-export.json"));
  EXPECT_EQ(record["files"].get<std::set<std::string>>(), (std::set<std::string>{"config.json", "model.safetensors"}));
}

// A model Mixtral cannot express is refused, naming what, and writes nothing: CCA attention
// (its tensors have no Mixtral name) and a partial rotary embedding (same tensors, another model).
TEST(ExportHf, CcaAndPartialRotaryAreNotExportedAsMixtral) {
  ScratchDir dir;
  for (const std::string what : {"cca", "partial_rotary"}) {
    ModelConfig m = testing::small_model(false);
    if (what == "cca") m.attention_layers = {"gqa", "cca"};
    else m.partial_rotary_factor = 0.5;
    const ParamLayout layout = ParamLayout::build(m);
    const std::vector<float> params(layout.total(), 0.f);
    const std::string out = dir / what;
    try {
      export_hf(out, m, layout, params.data());
      ADD_FAILURE() << what << " exported as Mixtral";
    } catch (const Error& e) {
      const std::string msg = e.what();
      // A mix of attention kinds is neither architecture (ckpt/export_zaya.h names the keys).
      EXPECT_NE(msg.find(what == "cca" ? "model.attention_layers" : "partial_rotary_factor"), std::string::npos) << msg;
      EXPECT_NE(msg.find("fix"), std::string::npos) << msg;
    }
    EXPECT_FALSE(fs::exists(out)) << what;
  }
}

}  // namespace
}  // namespace atl
