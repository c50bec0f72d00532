// Islands that sync on a time budget (diloco.sync_seconds) through `atoll launch`: 2 islands on
// the micro model, H = 20 the cap, a budget of 1 s; island 1 stalls 3 s inside inner step 3
// (ATOLL_FAULT stall), so its first round ends after step 3 while island 0 runs on to the cap
// and arrives early. The slow island's round shows fewer inner steps and a smaller weight; it
// adopts the round's furthest step; θ hashes agree at every outer step; both islands end at
// train.steps with exit 0; `tokens` counts the batches actually trained (one row per trained
// step at train.log_every = 1); checkpoints fall at commits only, and the run resumes from one.
// Refused combinations are ConfigErrors that name the keys and the fix.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

class TimeBudget : public CliTest {
 protected:
  static constexpr int64_t kSteps = 100, kH = 20, kTokensPerStep = 4 * MicroWorld::kSeqLen;  // batch_size 4
  std::vector<std::string> args(const std::string& run, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> a = {"launch", "--islands", "2", "--config", world().config(), "--run-dir", run};
    for (const std::string& kv : {"train.steps=" + std::to_string(kSteps), "diloco.inner_steps=" + std::to_string(kH),
                                 std::string("diloco.sync_seconds=1"), std::string("train.eval_every=0"),
                                 std::string("train.log_every=1"), std::string("checkpoint.every=10"),
                                 std::string("checkpoint.keep=20"), std::string("optim.warmup_steps=0")})
      a.insert(a.end(), {"--set", kv});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  // The run with island 1 stalled 3 s inside inner step 3.
  ::testing::AssertionResult run_with_a_slow_island(const std::string& run) const {
    child_env().push_back("ATOLL_FAULT=stall:island=1:step=3:seconds=3");
    const RunResult r = run_atoll(args(run), 180);
    child_env().pop_back();
    if (r.exit_code == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << r.describe();
  }

  struct Island {
    std::vector<nlohmann::json> rows;           // every row, in order
    std::map<int64_t, nlohmann::json> outer;    // outer step -> its row
  };
  static std::map<int, Island> islands(const std::string& run) {
    std::map<int, Island> by;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl")) {
      Island& i = by[row["island"].get<int>()];
      i.rows.push_back(row);
      if (row.contains("theta_hash")) i.outer[row["outer_step"].get<int64_t>()] = row;
    }
    return by;
  }

  // What every time-budget run must show from `from_step` on (a resumed run logs from there).
  static void expect_consistent(const std::string& run, int64_t from_tokens) {
    const auto by = islands(run);
    ASSERT_EQ(by.size(), 2u);
    const Island &a = by.at(0), &b = by.at(1);
    ASSERT_EQ(a.outer.size(), b.outer.size()) << "both islands log every outer step";
    int64_t tokens = from_tokens;
    for (const auto& [step, row] : a.outer) {
      const nlohmann::json& other = b.outer.at(step);
      EXPECT_EQ(row["theta_hash"], other["theta_hash"]) << "outer step " << step;
      EXPECT_EQ(row["step"], other["step"]) << "outer step " << step << ": the islands adopt one step";
      EXPECT_EQ(row["tokens"], other["tokens"]) << "outer step " << step;
      tokens += row["round_tokens"].get<int64_t>() + other["round_tokens"].get<int64_t>();
      EXPECT_EQ(row["tokens"].get<int64_t>(), tokens) << "outer step " << step << ": the rounds' tokens in all";
      for (const nlohmann::json* r : {&row, &other}) {
        EXPECT_EQ((*r)["round_tokens"].get<int64_t>(), (*r)["round_steps"].get<int64_t>() * kTokensPerStep);
        EXPECT_GE((*r)["round_steps"].get<int64_t>(), 1);
        EXPECT_LE((*r)["round_steps"].get<int64_t>(), kH) << "H is the cap";
      }
    }
    // Every trained step logged one row: the batches trained are the rows, and their tokens are
    // the run's count at its end.
    int64_t trained = 0;
    for (const Island* i : {&a, &b}) {
      int64_t steps = 0;
      for (const auto& [s, row] : i->outer) steps += row["round_steps"].get<int64_t>();
      EXPECT_EQ(int64_t(i->rows.size()), steps) << "each trained step in exactly one round";
      EXPECT_EQ(i->rows.back()["step"], kSteps) << "every island reaches train.steps";
      trained += int64_t(i->rows.size());
    }
    EXPECT_EQ(a.rows.back()["tokens"].get<int64_t>(), from_tokens + trained * kTokensPerStep);
  }
};

TEST_F(TimeBudget, ASlowIslandSyncsAfterFewerStepsWithAWeightByTokens) {
  const std::string run = dir("run");
  ASSERT_TRUE(run_with_a_slow_island(run));
  expect_consistent(run, 0);
  const auto by = islands(run);
  const nlohmann::json &fast = by.at(0).outer.at(1), &slow = by.at(1).outer.at(1);
  const int64_t n_fast = fast["round_steps"], n_slow = slow["round_steps"];
  EXPECT_LE(n_slow, 3) << "the stalled island's round ends with the step that ran past the budget";
  EXPECT_GT(n_fast, n_slow) << fast.dump() << "\n" << slow.dump();
  EXPECT_EQ(slow["step"], n_fast) << "the slow island adopts the furthest step";
  EXPECT_DOUBLE_EQ(slow["round_weight"].get<double>(), 2.0 * double(n_slow) / double(n_fast + n_slow));
  EXPECT_DOUBLE_EQ(fast["round_weight"].get<double>(), 2.0 * double(n_fast) / double(n_fast + n_slow));
  // Checkpoints only at commits: each at a step both islands logged an outer step at.
  std::set<int64_t> commits;
  for (const auto& [s, row] : by.at(0).outer) commits.insert(row["step"].get<int64_t>());
  size_t saves = 0;
  for (const auto& e : read_jsonl(run + "/events.jsonl"))
    if (e["event"] == "checkpoint") {
      ++saves;
      EXPECT_TRUE(commits.count(e["step"].get<int64_t>())) << e.dump();
    }
  EXPECT_GE(saves, 2u);
  // The data cursors count the batches each island read: its rows (batch_size 4 windows each).
  const nlohmann::json loaders = nlohmann::json::parse(read_file(run + "/checkpoints/step-00000100/manifest.json"))
                                     .at("state").at("loaders");
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(loaders.at(i).at("epoch"), 0) << "the corpus holds the run's windows";
    EXPECT_EQ(loaders.at(i).at("position").get<int64_t>(), int64_t(by.at(i).rows.size()) * 4) << loaders.dump();
  }
}

TEST_F(TimeBudget, ARunResumesFromItsCheckpoint) {
  const std::string run = dir("run");
  ASSERT_TRUE(run_with_a_slow_island(run));
  // The first checkpoint: the run as it stood there, resumed.
  int64_t first = kSteps;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints"))
    if (e.path().filename().string().rfind("step-", 0) == 0)
      first = std::min<int64_t>(first, std::stoll(e.path().filename().string().substr(5)));
  ASSERT_LT(first, kSteps);
  const std::string cut = dir("cut");
  fs::create_directories(cut + "/checkpoints");
  fs::copy(run + "/config.toml", cut + "/config.toml");
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(first));
  fs::copy(run + "/checkpoints/" + name, cut + "/checkpoints/" + name, fs::copy_options::recursive);
  std::ofstream(cut + "/checkpoints/latest") << name << "\n";
  const int64_t tokens = nlohmann::json::parse(read_file(cut + "/checkpoints/" + name + "/manifest.json"))
                             .at("state").at("tokens").get<int64_t>();
  std::vector<std::string> v = args(cut);
  v.push_back("--resume");
  const RunResult b = run_atoll(v, 180);
  ASSERT_EQ(b.exit_code, 0) << b.describe();
  expect_consistent(cut, tokens);
  bool resumed = false;
  for (const auto& e : read_jsonl(cut + "/events.jsonl"))
    if (e["event"] == "resume") resumed = e["step"].get<int64_t>() == first;
  EXPECT_TRUE(resumed);
}

TEST_F(TimeBudget, RefusedCombinationsNameTheKeysAndTheFix) {
  struct Case {
    std::vector<std::string> extra;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--set", "diloco.fragments=2"}, "diloco.sync_seconds > 0 (islands syncing on a time budget) works with "
                                        "diloco.fragments = 1 and diloco.overlap_steps = 0 (here 2 and 0); fix:"},
      {{"--set", "diloco.overlap_steps=1"}, "(here 1 and 1); fix: set diloco.fragments = 1 and diloco.overlap_steps = 0"},
      {{"--set", "diloco.sync_seconds=60"}, "diloco.sync_seconds (60.0) must be below fault.timeout_s (60.0)"},
      {{"--set", "fault.outer_deadline_s=0.5"}, "fault.outer_deadline_s (0.5) must exceed diloco.sync_seconds (1.0)"},
      {{"--workers-per-island", "2"}, "works with one worker per island (here --workers-per-island 2); fix: "
                                      "--workers-per-island 1, or diloco.sync_seconds = 0"}};
  for (const Case& c : cases) {
    const std::string run = dir("refused");
    const RunResult r = run_atoll(args(run, c.extra), 60);
    EXPECT_NE(r.exit_code, 0) << r.describe();
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.describe();
    EXPECT_FALSE(fs::exists(run + "/metrics.jsonl")) << "nothing trained";
  }
}

}  // namespace
}  // namespace atl::testing
