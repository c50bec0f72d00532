// Training on a mixture with phases, end to end: data_phase events in events.jsonl, a run resumed
// inside the second phase equal to an uninterrupted one, and the bad mixtures refused before
// anything is written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "atoll/core/errors.h"
#include "atoll/data/prepare.h"
#include "atoll/train/trainer.h"
#include "data/temp_dir.h"
#include "data/text_gen.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> rows;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) rows.push_back(json::parse(line));
  return rows;
}

class DataMixTrain : public ::testing::Test {
 protected:
  // Two datasets from different texts with one tokenizer (b reuses a's), and a third with its own.
  static void SetUpTestSuite() {
    root_ = new testing::TempDir();
    for (int d = 0; d < 3; ++d) {
      std::string text;
      for (const auto& doc : testing::make_docs(1500, 7 + d)) text += doc + "\n";
      testing::write_file(*root_ / ("corpus" + std::to_string(d) + ".txt"), text);
    }
    auto prepare = [](int d, const std::string& tokenizer, int vocab) {
      PrepareOptions o;
      o.inputs = {*root_ / ("corpus" + std::to_string(d) + ".txt")};
      o.out_dir = *root_ / ("ds" + std::to_string(d));
      o.vocab_size = vocab, o.tokenizer = tokenizer, o.min_val_tokens = 33, o.threads = 1;
      prepare_data(o);
    };
    prepare(0, "", 384);
    prepare(1, *root_ / "ds0/tokenizer.model", 384);
    prepare(2, "", 320);
  }
  static void TearDownTestSuite() {
    delete root_;
    root_ = nullptr;
  }
  static std::string ds(int d) { return *root_ / ("ds" + std::to_string(d)); }

  static Config config(int steps) {
    Config c;
    ModelConfig& m = c.model;
    m.vocab_size = 384, m.dim = 32, m.n_layers = 1, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 16;
    m.n_experts = 2, m.top_k = 1, m.expert_hidden = 32, m.seq_len = 32;
    c.train.steps = steps, c.train.batch_size = 4, c.train.eval_every = 5, c.train.eval_batches = 1;
    c.checkpoint.every = 8;
    // 128 tokens a step: phase 1 starts with step 6 (5 steps done), before the step-8 checkpoint.
    c.data.phases = {{.at_tokens = 0, .mix = {{ds(0), 1.0}}},
                     {.at_tokens = 640, .mix = {{ds(0), 0.5}, {ds(1), 0.5}}}};
    return c;
  }

  static std::map<int64_t, json> metrics(const std::string& run) {
    std::map<int64_t, json> rows;
    for (const json& j : read_jsonl(run + "/metrics.jsonl")) rows[j["step"].get<int64_t>()] = j;
    return rows;
  }
  static std::vector<json> phase_events(const std::string& run) {
    std::vector<json> out;
    for (const json& e : read_jsonl(run + "/events.jsonl"))
      if (e["event"] == "data_phase") out.push_back(e);
    return out;
  }

  static testing::TempDir* root_;
  testing::TempDir dir_;
};
testing::TempDir* DataMixTrain::root_ = nullptr;

TEST_F(DataMixTrain, PhasesAreLoggedAndExactAcrossResume) {
  const Config c = config(12);
  train(c, {.run_dir = dir_ / "full", .quiet = true});
  // Stopped after step 9, resumed from the step-8 checkpoint: inside phase 1.
  train(c, {.run_dir = dir_ / "resumed", .quiet = true, .stop_after = 9});
  train(c, {.run_dir = dir_ / "resumed", .resume = true, .quiet = true});

  for (const std::string run : {"full", "resumed"}) {
    const std::vector<json> events = phase_events(dir_ / run);
    ASSERT_EQ(events.size(), 2u) << run << ": each phase is logged once, also across the resume";
    EXPECT_EQ(events[0]["phase"], 0);
    EXPECT_EQ(events[0]["tokens"], 0);
    EXPECT_EQ(events[1]["phase"], 1);
    EXPECT_EQ(events[1]["tokens"], 640);
    EXPECT_EQ(events[1]["step"], 5);
    ASSERT_EQ(events[1]["mix"].size(), 2u);
    EXPECT_EQ(events[1]["mix"][1]["dir"], ds(1));
  }
  const auto a = metrics(dir_ / "full"), b = metrics(dir_ / "resumed");
  ASSERT_EQ(a.size(), 12u);
  // Validation: in phase 0 only ds0 is evaluated; in phase 1 both, val_loss their mean weighted
  // 0.5/0.5 by the phase.
  EXPECT_EQ(a.at(5)["val_losses"].size(), 1u) << a.at(5);
  const json v10 = a.at(10)["val_losses"];
  ASSERT_EQ(v10.size(), 2u) << a.at(10);
  EXPECT_NEAR(a.at(10)["val_loss"].get<double>(), 0.5 * v10[ds(0)].get<double>() + 0.5 * v10[ds(1)].get<double>(), 1e-6);
  for (const auto& [step, row] : a) {
    ASSERT_TRUE(b.count(step)) << "step " << step;
    EXPECT_EQ(row["loss"], b.at(step)["loss"]) << "step " << step;
    EXPECT_EQ(row.value("val_loss", json()), b.at(step).value("val_loss", json())) << "step " << step;
  }
}

// Each bad mixture is refused with the key, the folder and the fix, before a run folder exists.
TEST_F(DataMixTrain, BadMixturesAreRefused) {
  struct Case {
    std::vector<MixSource> mix;
    std::vector<std::string> must_name;
  };
  testing::write_file(dir_ / "unprepared/notes.txt", "text\n");
  const std::vector<Case> cases = {
      {{{ds(0), 1}, {dir_ / "missing", 1}}, {"data.mix[1].dir", "missing", "does not exist", "atoll data prepare"}},
      {{{ds(0), 1}, {dir_ / "unprepared", 1}}, {"data.mix[1].dir", "meta.json", "not a prepared dataset"}},
      {{{ds(0), 1}, {ds(2), 1}}, {"data.mix[1].dir", "ds2/meta.json", "differs from data.mix[0].dir", "--tokenizer"}},
  };
  for (const Case& k : cases) {
    Config c = config(2);
    c.data.phases.clear();
    c.data.mix = k.mix;
    try {
      train(c, {.run_dir = dir_ / "run", .quiet = true});
      ADD_FAILURE() << "no error for " << k.must_name[0];
    } catch (const Error& e) {  // DataError, or PathError for a folder that is missing (core/user_path.h)
      for (const std::string& s : k.must_name) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir_ / "run")) << "a refused mixture made the run folder";
  }
}

}  // namespace
}  // namespace atl
