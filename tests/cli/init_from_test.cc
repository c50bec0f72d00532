// `atoll train --init-from DIR` (ckpt/import_hf.h, docs/weights.md): micro models written in
// Hugging Face layout by tests/reference/hf_moe.py from a seeded generator (Mixtral per-expert and
// transformers v5 fused, Llama as one expert; one file or shards; F32, BF16, F16; tied or not) are
// imported, `atoll eval` equals the reference's numpy forward of the original folder (1e-6
// relative), and the export gives the folder's tensors back value for value. Then: continue
// training and resume; and every bad input refused with nothing of the run written.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

class InitFrom : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) GTEST_SKIP() << "no python3-numpy";
  }
  static std::string script() {
    const char* src = std::getenv("ATOLL_SOURCE_DIR");
    return std::string(src ? src : ".") + "/tests/reference/hf_moe.py";
  }
  static std::string python(const std::string& args) {
    std::string out;
    FILE* p = popen(("/usr/bin/python3 '" + script() + "' " + args + " 2>&1").c_str(), "r");
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int rc = pclose(p);
    if (rc != 0) out = "FAILED: " + out;
    return out;
  }
  // An HF folder of the micro shape, its tokenizer the micro data's.
  std::string make(const std::string& name, const std::string& arch, const std::string& layout, int shards,
                   const std::string& dtype, bool tie = false) {
    const std::string hf = dir(name);
    const std::string out = python("make '" + hf + "' " + arch + " " + layout + " " + std::to_string(shards) + " " + dtype +
                                   (tie ? " tie" : " untied") + " 7 '" + base_run() + "/tokenizer.model'");
    EXPECT_EQ(out, "");
    return hf;
  }
  // `atoll train --init-from hf` for `steps` steps at lr 0 (the weights stay the imported ones).
  RunResult init(const std::string& hf, const std::string& run, std::vector<std::string> more = {}) {
    std::vector<std::string> a = {"--init-from", hf, "--set", "train.steps=1", "--set", "optim.lr=0", "--set",
                                  "checkpoint.every=1", "--set", "train.eval_every=0"};
    a.insert(a.end(), more.begin(), more.end());
    return world().train(run, a);
  }
  // `atoll eval` of `run` equals the reference forward of the folder `hf` (1e-6 relative).
  void same_loss(const std::string& hf, const std::string& run) {
    const std::string shard = dir("tokens.bin");
    std::vector<uint16_t> toks;
    uint32_t s = 99;
    for (int i = 0; i < 3 * MicroWorld::kSeqLen + 1; ++i) toks.push_back(uint16_t(((s = s * 1103515245u + 12345u) >> 16) % 384));
    write_file(shard, llmc_shard(toks));
    const RunResult e = run_atoll({"eval", "--checkpoint", run, "--data", shard});
    ASSERT_EQ(e.exit_code, 0) << e.describe();
    const json ref = json::parse(python("forward '" + hf + "' '" + shard + "' " + std::to_string(MicroWorld::kSeqLen)), nullptr, false);
    ASSERT_TRUE(ref.is_object()) << ref.dump();
    const double want = ref["loss"].get<double>(), got = json::parse(e.out)["loss"].get<double>();
    EXPECT_NEAR(got, want, 1e-6 * want) << "atoll eval " << got << ", reference forward " << want;
  }
  void round_trip(const std::string& name, const std::string& arch, const std::string& layout, int shards,
                  const std::string& dtype, bool tie = false) {
    const std::string hf = make(name + "-hf", arch, layout, shards, dtype, tie), run = dir(name), back = dir(name + "-back");
    const RunResult t = init(hf, run);
    ASSERT_EQ(t.exit_code, 0) << t.describe();
    same_loss(hf, run);
    const RunResult x = run_atoll({"export", "--checkpoint", run, "--format", "hf", "--out", back});
    ASSERT_EQ(x.exit_code, 0) << x.describe();
    EXPECT_EQ(python("same '" + hf + "' '" + back + "'"), "");
    // The event names the source, its files' checksums and the layout.
    bool seen = false;
    for (const auto& line : split_lines(read_file(run + "/events.jsonl"))) {
      const json ev = json::parse(line);
      if (ev["event"] != "init_from") continue;
      seen = true;
      EXPECT_EQ(ev["xxh3"].size(), size_t(shards + 2)) << line;  // the weights, config.json, tokenizer.model
      EXPECT_EQ(ev["expert_layout"], arch == "llama"       ? "dense"
                                     : layout == "fused"   ? "fused"
                                     : arch == "mixtral"   ? "per-expert"
                                                           : "per-expert-mlp")
          << line;
    }
    EXPECT_TRUE(seen) << "no init_from event";
  }
  // A refused import: exit non-zero, the error line holding `want`, and no run folder written.
  void refused(const std::string& hf, const std::string& want, std::vector<std::string> more = {}) {
    const std::string run = dir("refused-run");
    const RunResult r = init(hf, run, more);
    EXPECT_NE(r.exit_code, 0) << r.describe();
    ASSERT_EQ(r.error_lines().size(), 1u) << r.describe();
    EXPECT_NE(r.error_lines()[0].find(want), std::string::npos) << r.error_lines()[0];
    EXPECT_FALSE(fs::exists(run + "/config.toml")) << "the refused run wrote its folder";
    EXPECT_FALSE(fs::exists(run + "/checkpoints"));
  }
};

TEST_F(InitFrom, MixtralPerExpertShardedBf16) { round_trip("px", "mixtral", "per-expert", 3, "BF16"); }
TEST_F(InitFrom, MixtralFusedSingleF32) { round_trip("fu", "mixtral", "fused", 1, "F32"); }
TEST_F(InitFrom, MixtralFusedShardedF16Tied) { round_trip("ft", "mixtral", "fused", 2, "F16", true); }
TEST_F(InitFrom, LlamaAsOneExpert) { round_trip("ll", "llama", "per-expert", 2, "BF16"); }
// Qwen3-MoE: q/k RMSNorm per head, norm_topk_prob true, a sliding_window that use_sliding_window
// false leaves unused. OLMoE: q/k RMSNorm over the whole projections, norm_topk_prob false.
TEST_F(InitFrom, Qwen3MoePerExpertShardedBf16) { round_trip("q3", "qwen3_moe", "per-expert", 2, "BF16"); }
TEST_F(InitFrom, Qwen3MoeFusedSingleF32) { round_trip("q3f", "qwen3_moe", "fused", 1, "F32"); }
TEST_F(InitFrom, OlmoePerExpertSingleF16Tied) { round_trip("ol", "olmoe", "per-expert", 1, "F16", true); }
TEST_F(InitFrom, OlmoeFusedShardedBf16) { round_trip("olf", "olmoe", "fused", 3, "BF16"); }
// Qwen2-MoE: q/k/v biases (qkv_bias absent: true), a shared expert of width 40 with its sigmoid
// gate, norm_topk_prob false, no head_dim field.
TEST_F(InitFrom, Qwen2MoePerExpertShardedBf16) { round_trip("q2", "qwen2_moe", "per-expert", 2, "BF16"); }
TEST_F(InitFrom, Qwen2MoeFusedSingleF32) { round_trip("q2f", "qwen2_moe", "fused", 1, "F32"); }

// Continue training a Qwen2-MoE: import, train 3 steps (the biases, the shared expert and its gate
// move with the rest), export; the reference forward of the export gives the loss `atoll eval`
// gives of the trained run (1e-6 relative), so the trained model leaves atoll as it computes. Its
// config.json turns the sliding window on with a window of the whole context.
TEST_F(InitFrom, Qwen2MoeTrainedExportEvaluatesTheSame) {
  const std::string hf = make("q2t-hf", "qwen2_moe", "per-expert", 1, "F32"), run = dir("q2t"), back = dir("q2t-back");
  json cfg = json::parse(read_file(hf + "/config.json"));  // a window that holds the context is full attention
  cfg["use_sliding_window"] = true, cfg["sliding_window"] = MicroWorld::kSeqLen;
  write_file(hf + "/config.json", cfg.dump());
  const RunResult t = world().train(run, {"--init-from", hf, "--set", "train.steps=3", "--set", "optim.lr=0.01",
                                          "--set", "checkpoint.every=3", "--set", "train.eval_every=0"});
  ASSERT_EQ(t.exit_code, 0) << t.describe();
  const RunResult x = run_atoll({"export", "--checkpoint", run, "--format", "hf", "--out", back});
  ASSERT_EQ(x.exit_code, 0) << x.describe();
  EXPECT_NE(read_file(back + "/config.json").find("\"Qwen2MoeForCausalLM\""), std::string::npos);
  EXPECT_NE(python("same '" + hf + "' '" + back + "'"), "") << "training moved no weight";
  same_loss(back, run);
}

// Upcycling: a dense Llama started as 4 experts, top 2, every expert its MLP and the router zero,
// computes the dense model's function (the reference forward of the Llama folder).
TEST_F(InitFrom, LlamaUpcycledToFourExperts) {
  const std::string hf = make("up-hf", "llama", "per-expert", 1, "BF16"), run = dir("up");
  const RunResult t = init(hf, run, {"--set", "model.n_experts=4", "--set", "model.top_k=2"});
  ASSERT_EQ(t.exit_code, 0) << t.describe();
  EXPECT_NE(read_file(run + "/config.toml").find("n_experts = 4"), std::string::npos);
  EXPECT_NE(read_file(run + "/events.jsonl").find("\"upcycled_experts\":4"), std::string::npos);
  same_loss(hf, run);
}

// ZayaForCausalLM, atoll's own export read back: a micro ZAYA1 (CCA, the zaya router, partial
// rotary, no residual scaling: the export writes identity scales) trained off its init, exported,
// imported; the import evaluates as the run did and exports the same tensors, byte for byte.
TEST_F(InitFrom, ZayaExportReadBack) {
  const std::string run = dir("zaya"), hf = dir("zaya-hf"), run2 = dir("zaya-run"), back = dir("zaya-back");
  std::vector<std::string> a;
  for (const char* kv : {"model.attention=\"cca\"", "model.router=\"zaya\"", "model.top_k=1",
                                "model.router_hidden_size=8", "model.partial_rotary_factor=0.5", "model.rope_theta=500.0",
                                "model.rope_layers=[\"global\", \"local\"]", "model.rope_theta_local=50.0",
                                "optim.lr=0.01", "train.steps=4", "checkpoint.every=4"})
    a.insert(a.end(), {"--set", kv});
  const RunResult t = world().train(run, a);
  ASSERT_EQ(t.exit_code, 0) << t.describe();
  ASSERT_EQ(run_atoll({"export", "--checkpoint", run, "--format", "hf", "--out", hf}).exit_code, 0);
  const RunResult i = init(hf, run2, {"--set", "optim.bias_balance_lr=0"});  // its one step changes nothing
  ASSERT_EQ(i.exit_code, 0) << i.describe();
  const RunResult e1 = run_atoll({"eval", "--checkpoint", run}), e2 = run_atoll({"eval", "--checkpoint", run2});
  ASSERT_EQ(e1.exit_code, 0) << e1.describe();
  ASSERT_EQ(e2.exit_code, 0) << e2.describe();
  const double l1 = json::parse(e1.out)["loss"].get<double>(), l2 = json::parse(e2.out)["loss"].get<double>();
  EXPECT_NEAR(l2, l1, 1e-6 * l1);
  ASSERT_EQ(run_atoll({"export", "--checkpoint", run2, "--format", "hf", "--out", back}).exit_code, 0);
  const auto ha = read_safetensors_header(hf + "/model.safetensors"), hb = read_safetensors_header(back + "/model.safetensors");
  const std::string ba = read_file(hf + "/model.safetensors"), bb = read_file(back + "/model.safetensors");
  ASSERT_EQ(ha.header.size(), hb.header.size());
  for (const auto& [name, t1] : ha.header.items()) {
    if (name == "__metadata__") continue;
    ASSERT_TRUE(hb.header.contains(name)) << name;
    const json& t2 = hb.header[name];
    EXPECT_EQ(t1["shape"], t2["shape"]) << name;
    const auto bytes = [](const std::string& all, size_t start, const json& t) {
      return all.substr(start + t["data_offsets"][0].get<size_t>(),
                        t["data_offsets"][1].get<size_t>() - t["data_offsets"][0].get<size_t>());
    };
    EXPECT_TRUE(bytes(ba, ha.data_start, t1) == bytes(bb, hb.data_start, t2)) << name << " changed in HF -> atoll -> HF";
  }
}

// Continue training: import, train, resume past it, export.
TEST_F(InitFrom, ContinueTrainingAndResume) {
  const std::string hf = make("hf", "mixtral", "fused", 2, "BF16"), run = dir("run");
  const RunResult a = world().train(run, {"--init-from", hf, "--set", "train.steps=4"});
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  const RunResult again = world().train(run, {"--resume", "--init-from", hf});
  EXPECT_NE(again.exit_code, 0);
  ASSERT_EQ(again.error_lines().size(), 1u) << again.describe();
  EXPECT_NE(again.error_lines()[0].find("--init-from " + hf + " with --resume"), std::string::npos) << again.describe();
  const RunResult r = run_atoll({"train", "--resume", "--run-dir", run, "--set", "train.steps=6", "--no-sample"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const RunResult x = run_atoll({"export", "--checkpoint", run, "--format", "hf", "--out", dir("out")});
  ASSERT_EQ(x.exit_code, 0) << x.describe();
  // Into a run that already has checkpoints: refused, the run unchanged.
  const std::string before = read_file(run + "/config.toml");
  const RunResult into = world().train(run, {"--init-from", hf});
  EXPECT_NE(into.exit_code, 0) << into.describe();
  EXPECT_EQ(read_file(run + "/config.toml"), before);
}

// atoll launch: every worker of every island starts from the imported weights; a bad folder is
// refused before the launcher writes anything.
TEST_F(InitFrom, LaunchTwoIslands) {
  const std::string hf = make("hf", "mixtral", "per-expert", 2, "BF16"), run = dir("run");
  const RunResult l = run_atoll({"launch", "--config", world().config(), "--run-dir", run, "--islands", "2", "--init-from", hf,
                                 "--set", "train.steps=2", "--set", "optim.lr=0", "--set", "checkpoint.every=2", "--set",
                                 "train.eval_every=0"}, 120);
  ASSERT_EQ(l.exit_code, 0) << l.describe();
  EXPECT_NE(read_file(run + "/events.jsonl").find("\"init_from\""), std::string::npos);
  const RunResult x = run_atoll({"export", "--checkpoint", run, "--format", "hf", "--out", dir("back")});
  ASSERT_EQ(x.exit_code, 0) << x.describe();
  EXPECT_EQ(python("same '" + hf + "' '" + dir("back") + "'"), "");
  fs::copy(hf, dir("bad"), fs::copy_options::recursive);
  fs::remove(dir("bad") + "/model-00002-of-00002.safetensors");
  const RunResult b = run_atoll({"launch", "--config", world().config(), "--run-dir", dir("badrun"), "--islands", "2",
                                 "--init-from", dir("bad")}, 60);
  EXPECT_NE(b.exit_code, 0);
  EXPECT_NE(b.err.find("model-00002-of-00002.safetensors, which is missing"), std::string::npos) << b.describe();
  EXPECT_FALSE(fs::exists(dir("badrun") + "/config.toml"));
}

TEST_F(InitFrom, SetModelDisagreeingIsRefused) {
  const std::string hf = make("hf", "mixtral", "per-expert", 1, "F32");
  refused(hf, "--set model.n_experts = 8 disagrees with " + hf + "/config.json, which gives 4", {"--set", "model.n_experts=8"});
}

TEST_F(InitFrom, BadFoldersAreRefused) {
  const std::string hf = make("hf", "mixtral", "per-expert", 2, "BF16");
  const auto edit_json = [](const std::string& path, const std::function<void(json&)>& f) {
    json j = json::parse(read_file(path));
    f(j);
    write_file(path, j.dump());
  };
  const auto copy = [&](const std::string& name) {
    fs::copy(hf, dir(name), fs::copy_options::recursive);
    return dir(name);
  };
  const std::string shard1 = "model-00001-of-00002.safetensors";
  {  // a missing shard
    const std::string d = copy("missing");
    fs::remove(d + "/" + shard1);
    refused(d, shard1 + ", which is missing");
  }
  for (const std::string& outside : {std::string("../") + shard1, std::string("/etc/passwd")}) {  // out of the folder
    const std::string d = copy("out" + std::to_string(outside.size()));
    edit_json(d + "/model.safetensors.index.json", [&](json& j) { j["weight_map"]["model.norm.weight"] = outside; });
    refused(d, "names weight file \"" + outside + "\", which is not a file name inside the folder");
  }
  {  // an index that puts a tensor in the other shard
    const std::string d = copy("wrongfile");
    std::string moved;
    edit_json(d + "/model.safetensors.index.json", [&](json& j) {
      for (auto& [k, v] : j["weight_map"].items())
        if (v == shard1 && moved.empty()) moved = k, v = "model-00002-of-00002.safetensors";
    });
    refused(d, "puts tensor '" + moved + "' in model-00002-of-00002.safetensors, but " + d + "/" + shard1 + " holds it");
  }
  {  // a symbolic link out of the folder
    const std::string d = copy("link");
    fs::rename(d + "/" + shard1, dir(shard1));
    fs::create_symlink(dir(shard1), d + "/" + shard1);
    refused(d, "a symbolic link to " + dir(shard1) + ", outside the folder");
  }
  {  // an unknown model_type, and one that needs a part atoll lacks
    const std::string d = copy("unknown");
    edit_json(d + "/config.json", [](json& j) { j["model_type"] = "gpt2"; });
    refused(d, "unknown model_type \"gpt2\"");
    edit_json(d + "/config.json", [](json& j) { j["model_type"] = "qwen2_moe"; });
    refused(d, "model_type qwen2_moe is imported as [\"Qwen2MoeForCausalLM\"] only");
  }
  {  // fields atoll does not model: refused with the field and its value
    const std::string d = copy("fields");
    edit_json(d + "/config.json", [](json& j) { j["sliding_window"] = 16; });
    refused(d, "field sliding_window = 16");
    edit_json(d + "/config.json", [](json& j) { j["sliding_window"] = nullptr, j["router_jitter_noise"] = 0.1; });
    refused(d, "field router_jitter_noise = 0.1");
    edit_json(d + "/config.json", [](json& j) { j.erase("router_jitter_noise"), j["norm_topk_prob"] = false; });
    refused(d, "field norm_topk_prob = false: atoll does not know this field");
  }
  {  // Qwen3-MoE's and OLMoE's fields atoll does not model
    const std::string d = dir("qwen3");
    python("make '" + d + "' qwen3_moe per-expert 1 F32 untied 7 '" + base_run() + "/tokenizer.model'");
    edit_json(d + "/config.json", [](json& j) { j["use_sliding_window"] = true; });
    refused(d, "field use_sliding_window = true");
    edit_json(d + "/config.json", [](json& j) { j["use_sliding_window"] = false, j["decoder_sparse_step"] = 2; });
    refused(d, "field decoder_sparse_step = 2");
    edit_json(d + "/config.json", [](json& j) { j["decoder_sparse_step"] = 1, j["mlp_only_layers"] = {0}; });
    refused(d, "field mlp_only_layers = [0]");
    const std::string o = dir("olmoe");
    python("make '" + o + "' olmoe per-expert 1 F32 untied 7 '" + base_run() + "/tokenizer.model'");
    edit_json(o + "/config.json", [](json& j) { j["clip_qkv"] = 8.0; });
    refused(o, "field clip_qkv = 8.0");
    const std::string q2 = dir("qwen2");
    python("make '" + q2 + "' qwen2_moe per-expert 1 F32 untied 7 '" + base_run() + "/tokenizer.model'");
    edit_json(q2 + "/config.json", [](json& j) { j["use_sliding_window"] = true; });
    refused(q2, "field use_sliding_window = true: atoll's attention sees the whole context, and sliding_window = 4 "
                "is shorter than model.seq_len");
    edit_json(q2 + "/config.json", [](json& j) { j["use_sliding_window"] = false, j["mlp_only_layers"] = {1}; });
    refused(q2, "field mlp_only_layers = [1]");
    edit_json(q2 + "/config.json", [](json& j) { j["mlp_only_layers"] = json::array(), j["qkv_bias"] = "yes"; });
    refused(q2, "field qkv_bias = \"yes\": not true or false");
    edit_json(q2 + "/config.json", [](json& j) { j.erase("qkv_bias"), j["head_dim"] = 8; });
    refused(q2, "field head_dim = 8: Qwen2-MoE's heads are hidden_size / num_attention_heads wide");
  }
  {  // a tensor of the wrong shape (config.json says otherwise)
    const std::string d = copy("shape");
    edit_json(d + "/config.json", [](json& j) { j["intermediate_size"] = 40; });
    refused(d, "has shape [48, 32], config.json says [40, 32]");
  }
  {  // a truncated file
    const std::string d = copy("truncated");
    const std::string bytes = read_file(d + "/" + shard1);
    write_file(d + "/" + shard1, bytes.substr(0, bytes.size() - 100));
    refused(d, "corrupt safetensors file " + d + "/" + shard1);
  }
  {  // only tokenizer.json
    const std::string d = copy("tokjson");
    fs::rename(d + "/tokenizer.model", d + "/tokenizer.json");
    refused(d, "has only tokenizer.json");
  }
}

}  // namespace
}  // namespace atl::testing
