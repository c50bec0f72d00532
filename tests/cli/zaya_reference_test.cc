// `atoll eval` on a ZAYA1 model equals what transformers computes on its export: a micro ZAYA1
// (CCA, the zaya router, residual scaling, partial rotary) trained a few steps so nothing is at
// its init, exported as Hugging Face `zaya`, and the export's forward computed by
// tests/reference/zaya_forward.py, a numpy transcription of transformers' modular_zaya.py that
// shares no code with atoll. Skipped without python3-numpy (scripts/setup.sh installs it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using json = nlohmann::json;

class ZayaReference : public CliTest {
 protected:
  // The micro model as ZAYA1: CCA over 1 KV head, top-1 of 4 experts through the zaya router
  // (R 8), residual scaling, half of each head rotated; a high learning rate and bias-balancing
  // rate so 10 steps move every tensor (temp, scales, biases, depth scale) well off its init.
  static std::vector<std::string> zaya_args(const std::vector<std::string>& more = {}) {
    std::vector<std::string> a;
    std::vector<std::string> kv = {"model.attention=\"cca\"",      "model.router=\"zaya\"",
                                   "model.top_k=1",                "model.router_hidden_size=8",
                                   "model.residual_scaling=true",  "model.partial_rotary_factor=0.5",
                                   "model.rope_theta=500.0",       "optim.lr=0.01",         "model.init_std=0.3",
                                   "optim.bias_balance_lr=0.05",   "train.steps=10",
                                   "checkpoint.every=10"};
    kv.insert(kv.end(), more.begin(), more.end());
    for (const std::string& s : kv) a.insert(a.end(), {"--set", s});
    return a;
  }

  // The values of one F32 tensor of an exported model.safetensors.
  static std::vector<float> tensor(const std::string& file, const std::string& name) {
    const SafetensorsHeader h = read_safetensors_header(file);
    const json& t = h.header.at(name);
    EXPECT_EQ(t.at("dtype"), "F32") << name;
    const uint64_t b = t.at("data_offsets")[0], e = t.at("data_offsets")[1];
    const std::string bytes = read_file(file).substr(h.data_start + b, e - b);
    std::vector<float> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }
  static bool all_equal(const std::vector<float>& v, float x) {
    for (float f : v)
      if (f != x) return false;
    return true;
  }

  // A shard of `windows` windows of arbitrary tokens below the micro vocabulary.
  static std::vector<uint16_t> tokens(int windows) {
    std::vector<uint16_t> t;
    uint32_t s = 12345;
    for (int i = 0; i < windows * MicroWorld::kSeqLen + 1; ++i) {
      s = s * 1103515245u + 12345u;
      t.push_back(static_cast<uint16_t>((s >> 16) % MicroWorld::kVocab));
    }
    return t;
  }

  // The reference forward's JSON on the export and the shard.
  static json reference(const std::string& hf, const std::string& shard) {
    const char* src = std::getenv("ATOLL_SOURCE_DIR");
    const std::string script = std::string(src ? src : ".") + "/tests/reference/zaya_forward.py";
    const std::string cmd = "/usr/bin/python3 '" + script + "' '" + hf + "' '" + shard + "' " +
                            std::to_string(MicroWorld::kSeqLen);
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return json();
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    if (pclose(p) != 0) ADD_FAILURE() << cmd << " failed: " << out;
    return json::parse(out, nullptr, false);
  }

  // Trains the micro ZAYA1 with `more` settings, exports it and compares `atoll eval`'s loss with
  // the reference's on 3 windows (96 predicted tokens). Tolerance: atoll computes in fp32, the
  // reference in float64; a mean loss near ln 384 agrees to 1e-6 relative (it does to 1e-9) when both compute the
  // same function, and any wrong convention (a rotation, a shift, a scale) moves it far more.
  // `skips`: whether some tokens must take the skip class (the reference counts them).
  void check(const std::string& name, const std::vector<std::string>& more, bool skips) {
    if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0)
      GTEST_SKIP() << "no python3-numpy: apt-get install python3-numpy (scripts/setup.sh installs it)";
    const std::string run = dir(name), hf = dir(name + "-hf"), shard = dir("tokens.bin");
    const RunResult t = world().train(run, zaya_args(more));
    ASSERT_EQ(t.exit_code, 0) << t.describe();
    const RunResult x = run_atoll({"export", "--checkpoint", run, "--format", "hf", "--out", hf});
    ASSERT_EQ(x.exit_code, 0) << x.describe();
    write_file(shard, llmc_shard(tokens(3)));

    // Nothing the comparison relies on is at its init.
    const std::string st = hf + "/model.safetensors";
    for (int l = 0; l < 2; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      EXPECT_FALSE(all_equal(tensor(st, p + "self_attn.qk_norm.temp"), 1.0f)) << "temp at its init, layer " << l;
      const std::vector<float> biases = tensor(st, p + "mlp.gate.balancing_biases");
      EXPECT_FALSE(all_equal({biases.begin(), biases.end() - 1}, 0.0f)) << "balancing biases at init, layer " << l;
      EXPECT_FALSE(all_equal(tensor(st, p + "post_mlp_residual_scale.residual_scale"), 1.0f)) << l;
      EXPECT_FALSE(all_equal(tensor(st, p + "post_attention_residual_scale.hidden_states_bias"), 0.0f)) << l;
    }
    EXPECT_FALSE(all_equal(tensor(st, "model.layers.1.mlp.gate.router_states_scale"), 1.0f));
    EXPECT_FALSE(all_equal(tensor(st, "model.input_hidden_states_scale"), 1.0f));

    const json theirs = reference(hf, shard);
    ASSERT_TRUE(theirs.is_object() && theirs.contains("loss")) << theirs.dump();
    if (skips) {
      EXPECT_GT(theirs["skipped"].get<int>(), 0) << "no token took the skip class";
    }
    const json& first = theirs["losses"][0];  // window 0's per-position losses
    // The first positions alone (where the convolutions' padding and the value shift act), then
    // all 3 windows: `--tokens n` is the mean loss of window 0's first n positions.
    for (int n : {1, 2, 3, 0}) {
      std::vector<std::string> args = {"eval", "--checkpoint", run, "--data", shard};
      if (n > 0) args.insert(args.end(), {"--tokens", std::to_string(n)});
      const RunResult e = run_atoll(args);
      ASSERT_EQ(e.exit_code, 0) << e.describe();
      const json ours = json::parse(e.out);
      double want = theirs["loss"].get<double>();
      if (n > 0) {
        want = 0;
        for (int i = 0; i < n; ++i) want += first[i].get<double>() / n;
      }
      EXPECT_EQ(ours["tokens"].get<int64_t>(), n > 0 ? n : theirs["tokens"].get<int64_t>());
      const double got = ours["loss"].get<double>();
      EXPECT_NEAR(got, want, 1e-6 * want) << "--tokens " << n << ": atoll eval " << got
                                          << ", transformers' forward (numpy) " << want;
    }
  }
};

TEST_F(ZayaReference, EvalEqualsTransformersForward) { check("zaya", {}, false); }

// Tied embeddings (ZAYA1's default), a KV group of 2 query heads per KV head, and a skip-class
// bias that sends some tokens past the experts.
TEST_F(ZayaReference, EvalEqualsTransformersForwardTiedWithSkips) {
  check("tied", {"model.tie_embeddings=true", "model.n_heads=4", "model.n_kv_heads=2", "model.router_skip_bias=0.1"},
        true);
}

// A RoPE base per layer (model.rope_layers): layer 1 is local, with a base far from the global
// one; the export gives it transformers' type hybrid_sliding, whose window (seq_len) sees every
// key of the context.
TEST_F(ZayaReference, EvalEqualsTransformersForwardWithARopeBasePerLayer) {
  check("rope", {"model.rope_layers=global,local", "model.rope_theta_local=7.0"}, false);
  const json cfg = json::parse(read_file(dir("rope-hf") + "/config.json"));
  EXPECT_EQ(cfg["layer_types"], json({"hybrid", "hybrid_sliding"}));
  EXPECT_EQ(cfg["rope_parameters"]["hybrid"]["rope_theta"].get<double>(), 500.0);
  EXPECT_EQ(cfg["rope_parameters"]["hybrid_sliding"]["rope_theta"].get<double>(), 7.0);
  EXPECT_EQ(cfg["rope_parameters"]["hybrid_sliding"]["partial_rotary_factor"].get<double>(), 0.5);
  EXPECT_EQ(cfg["sliding_window"].get<int>(), MicroWorld::kSeqLen);
}

}  // namespace
}  // namespace atl::testing
