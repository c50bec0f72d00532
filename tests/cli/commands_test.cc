// The commands on good input (DESIGN.md "Command line" and "Files"): what `train` writes into
// its run directory, `eval`'s one JSON object (also on a hand-written llm.c shard), `generate`,
// `export --format hf` (exactly the Hugging Face Mixtral names and shapes, tied and untied),
// `data prepare`'s shards, `--help-config` and `--version`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "atoll/atoll_config.h"
#include "atoll/config/config.h"
#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using nlohmann::json;

class Commands : public CliTest {};

TEST_F(Commands, Version) {
  const RunResult r = run_atoll({"--version"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.out.find(ATOLL_VERSION), std::string::npos) << r.out;
}

TEST_F(Commands, HelpConfigListsEveryKey) {
  const RunResult r = run_atoll({"train", "--help-config"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  std::set<std::string> listed;
  for (const auto& line : split_lines(r.out)) listed.insert(line.substr(0, line.find(' ')));
  for (const auto& k : config_keys()) EXPECT_TRUE(listed.count(k.key)) << k.key;
  // The keys scripts rely on (DESIGN.md "Files").
  for (const char* k : {"train.steps", "train.batch_size", "train.seed", "train.eval_every", "optim.name", "optim.lr",
                        "train.precision", "model.seq_len", "data.input", "data.vocab_size", "diloco.inner_steps",
                        "diloco.outer_lr", "diloco.outer_momentum", "diloco.codec", "diloco.fragments",
                        "diloco.overlap_steps", "checkpoint.every", "checkpoint.keep"})
    EXPECT_TRUE(listed.count(k)) << k;
}

// Each key's line shows its default and the values it takes (choices for strings).
TEST_F(Commands, HelpConfigShowsDefaultsAndAllowedValues) {
  const RunResult r = run_atoll({"train", "--help-config"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  std::map<std::string, std::vector<std::string>> fields;  // key -> its line's words
  for (const auto& line : split_lines(r.out)) {
    std::istringstream words(line);
    std::string w, key;
    words >> key;
    while (words >> w) fields[key].push_back(w);
  }
  auto line_has = [&](const std::string& key, const std::vector<std::string>& want) {
    const auto& f = fields[key];
    for (const auto& w : want)
      if (std::find(f.begin(), f.end(), w) == f.end()) return ::testing::AssertionFailure() << key << " lacks " << w;
    return ::testing::AssertionSuccess();
  };
  EXPECT_TRUE(line_has("optim.beta1", {"float", "0.9", "[0,", "1)"}));
  EXPECT_TRUE(line_has("optim.eps", {"1e-08", "(0,", "1]"}));
  EXPECT_TRUE(line_has("optim.lr", {"0.003", ">=", "0"}));
  EXPECT_TRUE(line_has("train.batch_size", {"int", "8", "[1,", "1048576]"}));
  EXPECT_TRUE(line_has("optim.name", {"string", "\"adamw\"", "adamw", "|", "muon", "sgd"}));
  EXPECT_TRUE(line_has("diloco.codec", {"\"int8\"", "fp32", "bf16", "int4"}));
  EXPECT_TRUE(line_has("model.tie_embeddings", {"bool", "false", "true"}));
  EXPECT_TRUE(line_has("fault.timeout_s", {"60.0", "[0.001,", "1e+06]"}));
}

TEST_F(Commands, UnknownCommandFails) {
  const RunResult r = run_atoll({"frobnicate"});
  EXPECT_NE(r.exit_code, 0) << r.describe();
}

TEST_F(Commands, TrainWritesItsRunDirectory) {
  const std::string run = dir("run");
  const RunResult r =
      world().train(run, {"--set", "train.steps=6", "--set", "train.eval_every=3", "--set", "checkpoint.every=3"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.out.find("run " + run + "\n"), std::string::npos) << r.out;  // the one-line summary

  // config.toml: the resolved config, loadable as it is.
  const Config saved = load_config(run + "/config.toml");
  EXPECT_EQ(saved.train.steps, 6);
  EXPECT_EQ(saved.model.dim, 32);
  EXPECT_EQ(saved.data.dir, world().data_dir());

  // metrics.jsonl: one line per step with the contract's fields, val_loss on eval steps.
  const auto rows = read_jsonl(run + "/metrics.jsonl");
  ASSERT_EQ(rows.size(), 6u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& row = rows[i];
    for (const char* k : {"step", "tokens", "loss", "lr", "tokens_per_s", "time_s"})
      EXPECT_TRUE(row.contains(k) && row[k].is_number()) << "step " << i + 1 << " lacks " << k;
    EXPECT_EQ(row["step"].get<int64_t>(), int64_t(i + 1));
    EXPECT_EQ(row["tokens"].get<int64_t>(), int64_t(i + 1) * 4 * MicroWorld::kSeqLen);
    EXPECT_TRUE(std::isfinite(row["loss"].get<double>()));
    EXPECT_GT(row["loss"].get<double>(), 0.0);
    EXPECT_EQ(row.contains("val_loss"), (i + 1) % 3 == 0) << "step " << i + 1;
  }

  // events.jsonl: start, a checkpoint at 3 and 6, end.
  std::vector<std::string> events;
  for (const auto& e : read_jsonl(run + "/events.jsonl")) events.push_back(e["event"].get<std::string>());
  EXPECT_EQ(events, (std::vector<std::string>{"start", "checkpoint", "checkpoint", "end"}));

  // checkpoints/step-NNNNNNNN with a manifest, and `latest` naming the newest.
  EXPECT_EQ(read_file(run + "/checkpoints/latest"), "step-00000006\n");
  for (const char* step : {"step-00000003", "step-00000006"}) {
    const std::string ck = run + "/checkpoints/" + step;
    ASSERT_TRUE(fs::exists(ck + "/manifest.json")) << ck;
    const json manifest = json::parse(read_file(ck + "/manifest.json"));
    EXPECT_EQ(manifest["step"].get<int64_t>(), std::stoll(std::string(step).substr(5)));
    EXPECT_TRUE(fs::exists(ck + "/rank-00000.safetensors"));
  }
  EXPECT_TRUE(fs::exists(run + "/tokenizer.model"));
}

TEST_F(Commands, ResumeOfAFinishedRunExtendsIt) {
  const std::string run = copy_of_base_run();
  const RunResult r = world().train(run, {"--resume", "--set", "train.steps=6"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const auto rows = read_jsonl(run + "/metrics.jsonl");
  ASSERT_EQ(rows.size(), 6u);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i]["step"].get<int64_t>(), int64_t(i + 1));
  EXPECT_EQ(read_file(run + "/checkpoints/latest"), "step-00000006\n");
}

// `atoll eval`: stdout is exactly one JSON object.
json eval_json(const std::vector<std::string>& args) {
  const RunResult r = run_atoll(args);
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  const auto lines = split_lines(r.out);
  EXPECT_EQ(lines.size(), 1u) << r.out;
  if (lines.size() != 1) return json::object();
  const json j = json::parse(lines[0]);
  EXPECT_TRUE(j.is_object());
  return j;
}

TEST_F(Commands, EvalPrintsOneJsonObject) {
  const json j = eval_json({"eval", "--checkpoint", base_run()});
  ASSERT_TRUE(j.contains("loss") && j.contains("perplexity") && j.contains("tokens")) << j.dump();
  const double loss = j["loss"].get<double>();
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(loss, 0.0);
  EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(loss), 1e-9 * std::exp(loss));
  const int64_t tokens = j["tokens"].get<int64_t>();
  EXPECT_GT(tokens, 0);
  EXPECT_EQ(tokens % MicroWorld::kSeqLen, 0);
  // Deterministic, and the same from the checkpoint directory as from the run directory.
  const json again = eval_json({"eval", "--checkpoint", base_run() + "/checkpoints/step-00000004"});
  EXPECT_EQ(again["loss"], j["loss"]);
  EXPECT_EQ(again["tokens"], j["tokens"]);
  // --tokens caps the predicted tokens.
  const json capped = eval_json({"eval", "--checkpoint", base_run(), "--tokens", "64"});
  EXPECT_EQ(capped["tokens"].get<int64_t>(), 64);
  // A --batch far beyond the windows the data holds is cut to them (it was std::bad_alloc).
  const json huge = eval_json({"eval", "--checkpoint", base_run(), "--batch", "1048576"});
  EXPECT_NEAR(huge["loss"].get<double>(), loss, 1e-6 * loss);  // summed in other groups
  EXPECT_EQ(huge["tokens"], j["tokens"]);
}

// A period-T token sequence of `windows` windows: every window [i*T, i*T+T+1) of it is the
// same.
std::vector<uint16_t> periodic(int windows) {
  constexpr int T = MicroWorld::kSeqLen;
  std::vector<uint16_t> t;
  for (int w = 0; w < windows; ++w)
    for (int i = 0; i < T; ++i) t.push_back(static_cast<uint16_t>(3 + (i * 11) % 380));
  t.push_back(t[0]);
  return t;
}

TEST_F(Commands, EvalReadsAHandWrittenLlmcShard) {
  // Every window of a periodic shard is the same, so the mean loss over three windows equals
  // the loss of one (llm.c's window rule, no auxiliary losses).
  constexpr int T = MicroWorld::kSeqLen;
  write_file(dir("one.bin"), llmc_shard(periodic(1)));
  write_file(dir("three.bin"), llmc_shard(periodic(3)));
  const json one = eval_json({"eval", "--checkpoint", base_run(), "--data", dir("one.bin")});
  const json three = eval_json({"eval", "--checkpoint", base_run(), "--data", dir("three.bin")});
  EXPECT_EQ(one["tokens"].get<int64_t>(), T);
  EXPECT_EQ(three["tokens"].get<int64_t>(), 3 * T);
  EXPECT_NEAR(one["loss"].get<double>(), three["loss"].get<double>(), 1e-5);
  // An untrained-ish model on arbitrary tokens: near the uniform loss ln(384).
  EXPECT_NEAR(one["loss"].get<double>(), std::log(384.0), 1.0);
  // A folder of shards: its val_*.bin.
  write_file(dir("folder/val_000000.bin"), llmc_shard(periodic(2)));
  const json folder = eval_json({"eval", "--checkpoint", base_run(), "--data", dir("folder")});
  EXPECT_EQ(folder["tokens"].get<int64_t>(), 2 * T);
  EXPECT_NEAR(folder["loss"].get<double>(), one["loss"].get<double>(), 1e-5);
}

// `--tokens N` evaluates exactly N predicted tokens (at most the shard's): a last sequence
// cut short counts its first positions only. The model is causal, so the loss of the first n
// positions of a window does not depend on the tokens after them; on a periodic shard, whose
// windows are all the same, 40 tokens are one whole window and the first 8 positions of the
// next: 40 * loss(40) = 32 * loss(32) + 8 * loss(8).
TEST_F(Commands, EvalTokensIsExactlyThatManyTokens) {
  write_file(dir("three.bin"), llmc_shard(periodic(3)));
  auto eval_tokens = [&](const std::string& n) {
    return eval_json({"eval", "--checkpoint", base_run(), "--data", dir("three.bin"), "--tokens", n});
  };
  const json one = eval_tokens("1"), eight = eval_tokens("8"), window = eval_tokens("32"), forty = eval_tokens("40");
  EXPECT_EQ(one["tokens"].get<int64_t>(), 1);
  EXPECT_EQ(eight["tokens"].get<int64_t>(), 8);
  EXPECT_EQ(window["tokens"].get<int64_t>(), 32);
  EXPECT_EQ(forty["tokens"].get<int64_t>(), 40);
  // fp32 losses summed in another order: 1e-5 relative is far below any real difference.
  const double want = (32 * window["loss"].get<double>() + 8 * eight["loss"].get<double>()) / 40;
  EXPECT_NEAR(forty["loss"].get<double>(), want, 1e-5 * want);
  EXPECT_TRUE(std::isfinite(one["loss"].get<double>()));
  // More than the shard holds: the whole shard, and the count says so.
  EXPECT_EQ(eval_tokens("1000")["tokens"].get<int64_t>(), 3 * MicroWorld::kSeqLen);
}

TEST_F(Commands, GenerateIsDeterministicForASeed) {
  auto generate = [&](const std::string& seed) {
    const RunResult r = run_atoll(
        {"generate", "--checkpoint", base_run(), "--prompt", "The island", "--max-tokens", "12", "--seed", seed});
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    return r.out;
  };
  const std::string a = generate("7");
  EXPECT_EQ(a.rfind("The island", 0), 0u) << a;
  EXPECT_GT(a.size(), std::string("The island\n").size()) << "nothing generated";
  EXPECT_EQ(generate("7"), a);
  const RunResult greedy = run_atoll(
      {"generate", "--checkpoint", base_run(), "--prompt", "A reef", "--max-tokens", "8", "--temperature", "0"});
  ASSERT_EQ(greedy.exit_code, 0) << greedy.describe();
  EXPECT_EQ(greedy.out.rfind("A reef", 0), 0u);
}

// ---------------------------------------------------------------------------------------------
// Export: the safetensors header lists exactly the Mixtral names and shapes.

// The Hugging Face MixtralForCausalLM tensors of the micro model (shapes [out, in]).
std::map<std::string, std::vector<int64_t>> mixtral_tensors(bool tied) {
  const int64_t V = 384, C = 32, L = 2, NH = 2, NKV = 1, HD = 16, E = 4, H = 48;
  std::map<std::string, std::vector<int64_t>> t;
  t["model.embed_tokens.weight"] = {V, C};
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t[p + "input_layernorm.weight"] = {C};
    t[p + "self_attn.q_proj.weight"] = {NH * HD, C};
    t[p + "self_attn.k_proj.weight"] = {NKV * HD, C};
    t[p + "self_attn.v_proj.weight"] = {NKV * HD, C};
    t[p + "self_attn.o_proj.weight"] = {C, NH * HD};
    t[p + "post_attention_layernorm.weight"] = {C};
    t[p + "block_sparse_moe.gate.weight"] = {E, C};
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      t[x + "w1.weight"] = {H, C};
      t[x + "w2.weight"] = {C, H};
      t[x + "w3.weight"] = {H, C};
    }
  }
  t["model.norm.weight"] = {C};
  if (!tied) t["lm_head.weight"] = {V, C};
  return t;
}

// The bytes of a tensor: from a safetensors file (by its header) or a checkpoint (by manifest).
std::string tensor_bytes(const std::string& file, const SafetensorsHeader& h, const std::string& name) {
  const auto& offs = h.header.at(name).at("data_offsets");
  const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
  return read_file(file).substr(h.data_start + begin, end - begin);
}

void check_export(const std::string& run, const std::string& out, bool tied) {
  const RunResult r = run_atoll({"export", "--checkpoint", run, "--format", "hf", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.describe();

  const json config = json::parse(read_file(out + "/config.json"));
  EXPECT_EQ(config["architectures"], json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(config["model_type"], "mixtral");
  EXPECT_EQ(config["vocab_size"], 384);
  EXPECT_EQ(config["hidden_size"], 32);
  EXPECT_EQ(config["intermediate_size"], 48);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["num_attention_heads"], 2);
  EXPECT_EQ(config["num_key_value_heads"], 1);
  EXPECT_EQ(config["num_local_experts"], 4);
  EXPECT_EQ(config["num_experts_per_tok"], 2);
  EXPECT_EQ(config["tie_word_embeddings"], tied);

  const std::string st = out + "/model.safetensors";
  const SafetensorsHeader h = read_safetensors_header(st);
  const auto want = mixtral_tensors(tied);
  std::map<std::string, std::vector<int64_t>> got;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, info] : h.header.items()) {
    if (name == "__metadata__") {
      EXPECT_EQ(info.value("format", ""), "pt");
      continue;
    }
    EXPECT_EQ(info.at("dtype"), "F32") << name;
    got[name] = info.at("shape").get<std::vector<int64_t>>();
    const auto offs = info.at("data_offsets").get<std::vector<uint64_t>>();
    uint64_t numel = 1;
    for (int64_t d : got[name]) numel *= static_cast<uint64_t>(d);
    EXPECT_EQ(offs[1] - offs[0], numel * 4) << name;
    spans.emplace_back(offs[0], offs[1]);
  }
  EXPECT_EQ(got, want);  // exactly these names, exactly these shapes
  for (const auto& [name, shape] : want)
    if (!got.count(name)) ADD_FAILURE() << "missing " << name;
  for (const auto& [name, shape] : got)
    if (!want.count(name)) ADD_FAILURE() << "unexpected " << name;
  // The data spans tile the file after the header.
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (const auto& [b, e] : spans) {
    EXPECT_EQ(b, at);
    at = e;
  }
  EXPECT_EQ(h.data_start + at, h.file_size);

  // The values are the checkpoint's: the embedding as it is, expert 1 of layer 0's w2 as the
  // second matrix of the stacked [E, C, H] tensor.
  const std::string ck = run + "/checkpoints/" + split_lines(read_file(run + "/checkpoints/latest"))[0];
  const std::string ck_file = ck + "/rank-00000.safetensors";
  const SafetensorsHeader ch = read_safetensors_header(ck_file);
  EXPECT_EQ(tensor_bytes(st, h, "model.embed_tokens.weight"), tensor_bytes(ck_file, ch, "param/embed"));
  const std::string w2 = tensor_bytes(ck_file, ch, "param/layers.0.moe.w2");
  EXPECT_EQ(tensor_bytes(st, h, "model.layers.0.block_sparse_moe.experts.1.w2.weight"),
            w2.substr(w2.size() / 4, w2.size() / 4));
  if (!tied) {
    EXPECT_EQ(tensor_bytes(st, h, "lm_head.weight"), tensor_bytes(ck_file, ch, "param/head"));
  }
  EXPECT_TRUE(fs::exists(out + "/tokenizer.model"));
}

// The export says how atoll tokenizes (no BOS, no EOS, no leading space) and its special ids,
// as SentencePiece itself reads them from the model (Python's binding, when installed).
TEST_F(Commands, ExportTellsToolsHowAtollTokenizes) {
  const RunResult r = run_atoll({"export", "--checkpoint", base_run(), "--format", "hf", "--out", dir("hf")});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const json tc = json::parse(read_file(dir("hf/tokenizer_config.json")));
  EXPECT_EQ(tc["add_bos_token"], false);
  EXPECT_EQ(tc["add_eos_token"], false);
  EXPECT_EQ(tc["add_prefix_space"], false);
  EXPECT_EQ(tc["bos_token"], "<s>");
  EXPECT_EQ(tc["eos_token"], "</s>");
  EXPECT_EQ(tc["unk_token"], "<unk>");
  EXPECT_TRUE(tc["pad_token"].is_null());
  const json cfg = json::parse(read_file(dir("hf/config.json")));
  // generation_config.json carries the same ids (transformers' generate() reads them there).
  const json gen = json::parse(read_file(dir("hf/generation_config.json")));
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) EXPECT_EQ(gen[key], cfg[key]) << key;
  EXPECT_TRUE(cfg["eos_token_id"].is_number());
  if (std::system("/usr/bin/python3 -c 'import sentencepiece' 2>/dev/null") != 0) GTEST_SKIP() << "no python3-sentencepiece";
  const std::string cmd = "/usr/bin/python3 -c \"import sentencepiece as s; p = s.SentencePieceProcessor(model_file='" +
                          dir("hf/tokenizer.model") + "'); print(p.bos_id(), p.eos_id(), p.pad_id())\"";
  FILE* f = ::popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  int bos = -9, eos = -9, pad = -9;
  EXPECT_EQ(std::fscanf(f, "%d %d %d", &bos, &eos, &pad), 3);
  ::pclose(f);
  EXPECT_EQ(cfg["bos_token_id"], bos);
  EXPECT_EQ(cfg["eos_token_id"], eos);
  EXPECT_EQ(pad, -1);
  EXPECT_TRUE(cfg["pad_token_id"].is_null());
}

TEST_F(Commands, ExportUntiedModel) {
  check_export(base_run(), dir("hf"), /*tied=*/false);
  // A previous export may be replaced by a new one; the files the user added to it are kept.
  write_file(dir("hf/README.md"), "# my model\n");
  write_file(dir("hf/generation_config.json"), "{\"temperature\": 0.7}\n");
  const RunResult again = run_atoll({"export", "--checkpoint", base_run(), "--format", "hf", "--out", dir("hf")});
  EXPECT_EQ(again.exit_code, 0) << again.describe();
  EXPECT_EQ(read_file(dir("hf/README.md")), "# my model\n");
  // The user's generation_config.json keeps its settings and gains the special ids.
  const json gen = json::parse(read_file(dir("hf/generation_config.json")));
  EXPECT_EQ(gen["temperature"], 0.7);
  EXPECT_EQ(gen["eos_token_id"], json::parse(read_file(dir("hf/config.json")))["eos_token_id"]);
  EXPECT_EQ(std::set<std::string>({"config.json", "model.safetensors", "tokenizer.model", "tokenizer_config.json",
                                   "atoll-export.json", "README.md", "generation_config.json"}),
            [&] {
              std::set<std::string> names;
              for (const auto& e : fs::directory_iterator(dir("hf"))) names.insert(e.path().filename().string());
              return names;
            }());
}

TEST_F(Commands, ExportTiedModel) {
  const RunResult r = world().train(dir("tied"), {"--set", "model.tie_embeddings=true", "--set", "train.steps=2"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  check_export(dir("tied"), dir("hf"), /*tied=*/true);
}

// ---------------------------------------------------------------------------------------------
// `atoll data prepare`: llm.c-format shards.

void check_shard(const std::string& path, int vocab) {
  const std::string bytes = read_file(path);
  ASSERT_GE(bytes.size(), 1024u) << path;
  int32_t header[256];
  std::memcpy(header, bytes.data(), sizeof header);
  EXPECT_EQ(header[0], 20240520) << path;
  EXPECT_EQ(header[1], 1) << path;
  EXPECT_GT(header[2], 0) << path;
  ASSERT_EQ(bytes.size(), 1024u + 2u * static_cast<uint64_t>(header[2])) << path;
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header[i], 0) << path << " header[" << i << "]";
  uint16_t max_id = 0;
  for (size_t i = 1024; i < bytes.size(); i += 2) {
    uint16_t t;
    std::memcpy(&t, bytes.data() + i, 2);
    max_id = std::max(max_id, t);
  }
  EXPECT_LT(max_id, vocab) << path;
}

TEST_F(Commands, DataPrepareWritesLlmcShards) {
  const std::string out = dir("prepared");
  const RunResult r = run_atoll({"data", "prepare", "--input", world().corpus(), "--out", out, "--vocab-size", "320"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.out.rfind("prepared ", 0), 0u) << r.out;
  const json meta = json::parse(read_file(out + "/meta.json"));
  const int vocab = meta["vocab_size"].get<int>();
  EXPECT_LE(vocab, 320);
  EXPECT_TRUE(fs::exists(out + "/tokenizer.model"));
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(out)) names.insert(e.path().filename().string());
  EXPECT_TRUE(names.count("train_000000.bin")) << r.out;
  EXPECT_TRUE(names.count("val_000000.bin")) << r.out;
  int64_t train_tokens = 0;
  for (const auto& n : names) {
    if (!n.ends_with(".bin")) continue;
    EXPECT_TRUE(n.starts_with("train_") || n.starts_with("val_")) << n;
    check_shard(out + "/" + n, vocab);
    if (n.starts_with("train_")) train_tokens += static_cast<int64_t>((fs::file_size(out + "/" + n) - 1024) / 2);
  }
  EXPECT_EQ(train_tokens, meta["train_tokens"].get<int64_t>());

  // The same command again reuses the folder, unchanged.
  const auto before = snapshot(out);
  const RunResult again =
      run_atoll({"data", "prepare", "--input", world().corpus(), "--out", out, "--vocab-size", "320"});
  ASSERT_EQ(again.exit_code, 0) << again.describe();
  EXPECT_EQ(again.out.rfind("reused ", 0), 0u) << again.out;
  EXPECT_TRUE(unchanged(before, snapshot(out)));

  // A model trains on it (data.dir) with a vocabulary that holds the tokenizer's.
  const RunResult train = world().train(
      dir("run"), {"--set", "data.dir=\"" + out + "\"", "--set", "model.vocab_size=320", "--set", "train.steps=2"});
  EXPECT_EQ(train.exit_code, 0) << train.describe();
}

TEST_F(Commands, TrainOnAFolderOfLlmcShards) {
  // Shards made elsewhere (no meta.json, no tokenizer): train, then eval on them.
  std::vector<uint16_t> train(2000), val(300);
  for (size_t i = 0; i < train.size(); ++i) train[i] = static_cast<uint16_t>((i * 31 + i / 7) % 384);
  for (size_t i = 0; i < val.size(); ++i) val[i] = static_cast<uint16_t>((i * 17) % 384);
  write_file(dir("llmc/train_000000.bin"), llmc_shard(train));
  write_file(dir("llmc/val_000000.bin"), llmc_shard(val));
  const RunResult r =
      world().train(dir("run"), {"--set", "data.dir=\"" + dir("llmc") + "\"", "--set", "train.steps=2"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const json j = eval_json({"eval", "--checkpoint", dir("run")});
  EXPECT_EQ(j["tokens"].get<int64_t>(), (300 - 1) / MicroWorld::kSeqLen * MicroWorld::kSeqLen);
}

}  // namespace
}  // namespace atl::testing
