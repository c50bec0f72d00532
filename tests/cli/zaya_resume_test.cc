// A model with ZAYA1's router and residual scaling trains through `atoll train`, logs each
// router's expert load, and resumes bit for bit: the balancing biases and their AdamW moments
// in the resumed run's checkpoint equal an uninterrupted run's, byte for byte.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

class ZayaRun : public CliTest {
 protected:
  // The micro model with the zaya router (top-1 of 4 experts, R 8) and residual scaling; a
  // constant learning rate, so a run of 2 steps extended to 4 computes what a run of 4 does.
  static std::vector<std::string> zaya_args(int steps) {
    std::vector<std::string> a;
    for (std::string kv : {"model.router=\"zaya\"", "model.top_k=1", "model.router_hidden_size=8",
                           "model.residual_scaling=true", "optim.schedule=\"constant\"", "optim.warmup_steps=0",
                           "optim.bias_balance_lr=0.01", "checkpoint.every=2"})
      a.insert(a.end(), {"--set", kv});
    a.insert(a.end(), {"--set", "train.steps=" + std::to_string(steps)});
    return a;
  }
  // name -> the tensor's bytes, for the tensors of a checkpoint whose name contains `part`.
  static std::map<std::string, std::string> tensors(const std::string& ck, const std::string& part) {
    std::map<std::string, std::string> out;
    for (const auto& entry : fs::directory_iterator(ck)) {
      if (entry.path().extension() != ".safetensors") continue;
      const SafetensorsHeader h = read_safetensors_header(entry.path().string());
      const std::string bytes = read_file(entry.path().string());
      for (const auto& [name, t] : h.header.items()) {
        if (name == "__metadata__" || name.find(part) == std::string::npos) continue;
        const uint64_t b = t.at("data_offsets")[0], e = t.at("data_offsets")[1];
        out[name] = bytes.substr(h.data_start + b, e - b);
      }
    }
    return out;
  }
};

TEST_F(ZayaRun, LogsLoadsAndResumesBiasesBitForBit) {
  base_run();  // prepares the data
  const std::string full = dir("full"), part = dir("part");
  const RunResult a = world().train(full, zaya_args(4));
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  const RunResult b = world().train(part, zaya_args(2));
  ASSERT_EQ(b.exit_code, 0) << b.describe();
  std::vector<std::string> more = zaya_args(4);
  more.push_back("--resume");
  const RunResult c = world().train(part, more);
  ASSERT_EQ(c.exit_code, 0) << c.describe();

  // Every step's row names each router's load: layers 0 and 1, shares of the 4 experts.
  for (const auto& row : read_jsonl(full + "/metrics.jsonl")) {
    ASSERT_TRUE(row.contains("load_entropy")) << row.dump();
    EXPECT_EQ(row["load_layer"], nlohmann::json({0, 1}));
    for (int l = 0; l < 2; ++l) {
      EXPECT_GE(row["load_max"][l].get<double>(), 0.25);
      EXPECT_LE(row["load_min"][l].get<double>(), 0.25);
      EXPECT_GE(row["load_entropy"][l].get<double>(), 0.0);
      EXPECT_LE(row["load_entropy"][l].get<double>(), 1.0 + 1e-12);
    }
  }
  const auto want = tensors(full + "/checkpoints/step-00000004", "balancing_biases");
  const auto got = tensors(part + "/checkpoints/step-00000004", "balancing_biases");
  ASSERT_GE(want.size(), 6u) << "the biases and both moments of 2 routers";
  EXPECT_EQ(got.size(), want.size());
  for (const auto& [name, bytes] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_EQ(got.at(name), bytes) << name << " differs after the resume";
  }
  // The biases moved from their start (zeros, the skip class -1) in 4 steps.
  bool moved = false;
  for (const auto& [name, bytes] : want)
    if (name.find("adam") == std::string::npos)
      for (size_t i = 0; i + 4 <= bytes.size() - 4; i += 4) moved |= bytes.substr(i, 4) != std::string(4, '\0');
  EXPECT_TRUE(moved) << "the balancing biases never moved";
}

}  // namespace
}  // namespace atl
