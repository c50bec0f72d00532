// The training loop end to end on a small synthetic corpus: exact resume, run-directory
// conflicts, the batch-size ramp, and the loss falling.
#include "atoll/train/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "atoll/core/errors.h"
#include "data/temp_dir.h"
#include "data/text_gen.h"

namespace atl {
namespace {

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string text;
    for (const auto& d : testing::make_docs(3000, 7)) text += d + "\n";
    testing::write_file(dir_ / "corpus.txt", text);
  }

  Config config(int steps) const {
    Config c;
    ModelConfig& m = c.model;
    m.vocab_size = 384, m.dim = 32, m.n_layers = 2, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 16;
    m.n_experts = 4, m.top_k = 2, m.expert_hidden = 48, m.seq_len = 32;
    c.train.steps = steps, c.train.batch_size = 4, c.train.eval_every = 5, c.train.eval_batches = 2;
    c.optim.lr = 3e-3, c.optim.warmup_steps = 5;
    c.data.input = {dir_ / "corpus.txt"};
    c.data.dir = dir_ / "data";
    c.checkpoint.every = 10;
    return c;
  }

  // step -> the metrics row of that step.
  static std::map<int64_t, nlohmann::json> metrics(const std::string& run) {
    std::map<int64_t, nlohmann::json> rows;
    std::ifstream f(run + "/metrics.jsonl");
    std::string line;
    while (std::getline(f, line)) {
      auto j = nlohmann::json::parse(line);
      rows[j["step"].get<int64_t>()] = j;
    }
    return rows;
  }

  testing::TempDir dir_;
};

TEST_F(TrainerTest, ResumeGivesIdenticalMetrics) {
  const Config full = config(20);
  train(full, {.run_dir = dir_ / "a", .quiet = true});
  // The same run stopped right after its step-10 checkpoint, then resumed.
  train(full, {.run_dir = dir_ / "b", .quiet = true, .stop_after = 10});
  train(full, {.run_dir = dir_ / "b", .resume = true, .quiet = true});
  auto a = metrics(dir_ / "a"), b = metrics(dir_ / "b");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (int64_t s = 1; s <= 20; ++s) {
    EXPECT_EQ(a[s]["loss"].get<double>(), b[s]["loss"].get<double>()) << "step " << s;  // bit for bit
    EXPECT_EQ(a[s].contains("val_loss"), b[s].contains("val_loss")) << "step " << s;
    if (s > 10 && a[s].contains("val_loss")) {
      EXPECT_EQ(a[s]["val_loss"].get<double>(), b[s]["val_loss"].get<double>()) << "step " << s;
    }
  }
}

TEST_F(TrainerTest, LossFallsAndRunDirectoryHoldsItsFiles) {
  const TrainResult r = train(config(40), {.run_dir = dir_ / "run", .quiet = true});
  EXPECT_LT(r.final_loss, 0.75 * r.first_loss);
  EXPECT_GT(r.final_val_loss, 0.0);
  for (const char* f : {"config.toml", "metrics.jsonl", "events.jsonl", "tokenizer.model", "checkpoints/latest"})
    EXPECT_TRUE(std::filesystem::exists(dir_ / ("run/" + std::string(f)))) << f;
}

TEST_F(TrainerTest, RefusesARunDirectoryHoldingAnotherRun) {
  train(config(2), {.run_dir = dir_ / "run", .quiet = true});
  std::ifstream f(dir_ / "run/config.toml");
  const std::string before((std::istreambuf_iterator<char>(f)), {});
  EXPECT_THROW(train(config(2), {.run_dir = dir_ / "run", .quiet = true}), RunDirConflict);
  Config other = config(2);
  other.model.n_layers = 3;
  EXPECT_THROW(train(other, {.run_dir = dir_ / "run", .resume = true, .quiet = true}), RunDirConflict);
  std::ifstream g(dir_ / "run/config.toml");
  EXPECT_EQ(before, std::string((std::istreambuf_iterator<char>(g)), {}));  // nothing overwritten
}

TEST_F(TrainerTest, BatchRampGrowsToTheTargetBatch) {
  Config c = config(12);
  c.train.batch_size = 4, c.train.micro_batch_size = 1, c.train.batch_ramp_start = 1;
  c.train.batch_ramp_tokens = 8 * 32;  // eight sequences
  train(c, {.run_dir = dir_ / "ramp", .quiet = true});
  auto rows = metrics(dir_ / "ramp");
  EXPECT_EQ(rows[1]["batch_size"].get<int>(), 1);
  EXPECT_EQ(rows[12]["batch_size"].get<int>(), 4);
  for (int64_t s = 2; s <= 12; ++s) EXPECT_GE(rows[s]["batch_size"].get<int>(), rows[s - 1]["batch_size"].get<int>());
}

}  // namespace
}  // namespace atl
