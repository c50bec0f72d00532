// Resuming a multi-island run (`atoll launch --resume`): the checkpoint holds every island's
// parameters and optimizer moments, θ, the outer momentum, every worker's loader cursor and the
// per-fragment outer step counts, so a run resumed from a checkpoint logs the same losses and θ
// hashes as the uninterrupted run, bit for bit (JSON numbers round-trip doubles). Checked from a
// checkpoint of the uninterrupted run itself (deterministic), across 2 islands x 2 workers, with
// streaming fragments overlapped, with error feedback, with Muon as the inner optimizer (its
// momentum travels in adam_m), inside and after a data-parallel warm start, and after a real
// stop (SIGINT to the launcher). A resume with another island shape is refused before anything
// starts.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using nlohmann::json;

class IslandResume : public CliTest {
 protected:
  std::vector<std::string> args(const std::string& run, const std::vector<std::string>& extra) const {
    std::vector<std::string> a = {"launch", "--config", world().config(), "--run-dir", run};
    for (const char* kv : {"train.eval_every=0", "checkpoint.every=5", "checkpoint.keep=20", "optim.warmup_steps=2"})
      a.insert(a.end(), {"--set", kv});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // (island, rank, step) -> {loss, theta_hash or ""}; every key once.
  static std::map<std::tuple<int, int, int64_t>, std::pair<double, std::string>> rows(const std::string& run) {
    std::map<std::tuple<int, int, int64_t>, std::pair<double, std::string>> r;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl")) {
      const auto key = std::make_tuple(row["island"].get<int>(), row["rank"].get<int>(), row["step"].get<int64_t>());
      EXPECT_FALSE(r.count(key)) << "step " << std::get<2>(key) << " logged twice in " << run;
      r[key] = {row["loss"].get<double>(), row.value("theta_hash", "")};
    }
    return r;
  }
  // The run in `from` copied to `to` as it stood at its checkpoint of `step` (later ones gone).
  static void cut_at(const std::string& from, const std::string& to, int64_t step) {
    fs::copy(from, to, fs::copy_options::recursive);
    for (const auto& e : fs::directory_iterator(to + "/checkpoints"))
      if (e.path().filename().string().rfind("step-", 0) == 0 && std::stoll(e.path().filename().string().substr(5)) > step)
        fs::remove_all(e.path());
    char name[32];
    std::snprintf(name, sizeof name, "step-%08lld\n", static_cast<long long>(step));
    std::ofstream(to + "/checkpoints/latest") << name;
  }
  static void expect_same_rows(const std::string& full, const std::string& resumed, size_t n) {
    const auto a = rows(full), b = rows(resumed);
    ASSERT_EQ(a.size(), n);
    ASSERT_EQ(b.size(), n);
    for (const auto& [key, v] : a) {
      ASSERT_TRUE(b.count(key));
      EXPECT_EQ(b.at(key).first, v.first) << "island " << std::get<0>(key) << " rank " << std::get<1>(key) << " step "
                                          << std::get<2>(key);
      EXPECT_EQ(b.at(key).second, v.second) << "step " << std::get<2>(key);
    }
  }
};

TEST_F(IslandResume, ResumedFromACheckpointLogsTheSameLossesAndHashes) {
  struct Case {
    std::string name;
    std::vector<std::string> extra;
    size_t rows;
  };
  const std::vector<Case> cases = {
      {"workers", {"--islands", "2", "--workers-per-island", "2", "--set", "train.steps=12", "--set",
                   "diloco.inner_steps=3"}, 48},
      {"streaming", {"--islands", "2", "--set", "train.steps=15", "--set", "model.n_layers=3", "--set",
                     "diloco.inner_steps=4", "--set", "diloco.fragments=2", "--set", "diloco.overlap_steps=1"}, 30},
      // The error-feedback residuals (one per fragment, sharded over the island's 2 ranks) resume too.
      {"error-feedback", {"--islands", "2", "--workers-per-island", "2", "--set", "train.steps=12", "--set",
                          "model.n_layers=3", "--set", "diloco.inner_steps=2", "--set", "diloco.fragments=2", "--set",
                          "diloco.error_feedback=true"}, 48},
      // MuLoCo: Muon's momentum (adam_m) for the hidden matrices, AdamW's moments for the rest.
      {"muon", {"--islands", "2", "--workers-per-island", "2", "--set", "train.steps=12", "--set",
                "diloco.inner_steps=3", "--set", "optim.name=muon"}, 48},
      // Cut inside the data-parallel warm start (θ is still the initial one) and after it.
      {"warm-start-7", {"--islands", "2", "--set", "train.steps=12", "--set", "diloco.inner_steps=3", "--set",
                        "diloco.dp_warmup_steps=7"}, 24},
      {"warm-start-4", {"--islands", "2", "--workers-per-island", "2", "--set", "train.steps=12", "--set",
                        "diloco.inner_steps=3", "--set", "diloco.dp_warmup_steps=4"}, 48}};
  for (const Case& c : cases) {
    const std::string full = dir(c.name + "-full"), cut = dir(c.name + "-cut");
    const RunResult a = run_atoll(args(full, c.extra), 120);
    ASSERT_EQ(a.exit_code, 0) << a.describe();
    cut_at(full, cut, 5);
    auto v = args(cut, c.extra);
    v.push_back("--resume");
    const RunResult b = run_atoll(v, 120);
    ASSERT_EQ(b.exit_code, 0) << b.describe();
    expect_same_rows(full, cut, c.rows);
    bool saw_resume = false;
    for (const auto& e : read_jsonl(cut + "/events.jsonl"))
      if (e["event"] == "resume") saw_resume = e["step"].get<int64_t>() == 5;
    EXPECT_TRUE(saw_resume) << c.name;
  }
}

// A real stop: SIGINT to the launcher right after its first checkpoint, then --resume. The model
// is larger than the micro one so that steps take long enough for the stop to land mid-run.
TEST_F(IslandResume, StoppedRunResumesToTheSameResult) {
  const std::vector<std::string> extra = {"--islands", "2", "--set", "train.steps=20", "--set", "diloco.inner_steps=4",
                                          "--set", "model.dim=64", "--set", "model.expert_hidden=128", "--set",
                                          "model.seq_len=128", "--set", "train.batch_size=8"};
  const std::string full = dir("full"), stopped = dir("stopped");
  const RunResult a = run_atoll(args(full, extra), 180);
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  {
    Background b(args(stopped, extra), dir("stopped-log"));
    const bool appeared = wait_for_file(stopped + "/checkpoints", "latest", 120.0, [&] { return b.running(); });
    ::kill(b.pid(), SIGINT);
    const int status = b.wait();
    ASSERT_TRUE(appeared) << read_file(dir("stopped-log.err"));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT)
        << "the run ended before it was stopped (status " << status << "); make its steps slower";
  }
  const std::string latest = split_lines(read_file(stopped + "/checkpoints/latest")).at(0);
  const int64_t ck_step = std::stoll(latest.substr(5));
  ASSERT_GE(ck_step, 5);
  ASSERT_LT(ck_step, 20);
  RecordProperty("stopped_after_checkpoint", static_cast<int>(ck_step));
  auto v = args(stopped, extra);
  v.push_back("--resume");
  const RunResult r = run_atoll(v, 180);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  expect_same_rows(full, stopped, 40);
}

TEST_F(IslandResume, AnotherIslandShapeIsRefused) {
  const std::string run = dir("run");
  const std::vector<std::string> extra = {"--islands", "2", "--set", "train.steps=5", "--set", "diloco.inner_steps=2"};
  ASSERT_EQ(run_atoll(args(run, extra)).exit_code, 0);
  const auto before = snapshot(run);
  auto v = args(run, {"--islands", "3", "--set", "train.steps=5", "--set", "diloco.inner_steps=2", "--resume"});
  EXPECT_TRUE(fails_clearly(run_atoll(v), {"2 islands x 1 workers", "--islands 2 --workers-per-island 1"}));
  v = args(run, {"--islands", "2", "--workers-per-island", "2", "--set", "train.steps=5", "--set",
                 "diloco.inner_steps=2", "--resume"});
  EXPECT_TRUE(fails_clearly(run_atoll(v), {"--workers-per-island 1"}));
  EXPECT_TRUE(unchanged(before, snapshot(run)));
}

}  // namespace
}  // namespace atl::testing
