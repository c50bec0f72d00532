// A save overlapped with training (state_checkpoint.h): the copy of the saved tensors into
// staging runs on the background writer while the next step computes its gradients, and the
// step waits at its fence before it writes them (train/step.h). Here the copy of the save at
// step 4 is made slow (ATOLL_FAULT=delay:...:ckpt=copy: one second after its first tensor), so
// the next step reaches its fence long before the copy is done, in a 2-island x 2-worker run:
//   - with the fence, the checkpoint of step 4 holds exactly step 4's state: a run resumed from
//     it logs the same losses and θ hashes as the uninterrupted run, bit for bit, and
//     ATOLL_CHECK_SNAPSHOT (each copy's checksum against its source's at save()) passes;
//   - without it (ATOLL_TEST_SKIP_CKPT_FENCE), the optimizer writes the parameters under the
//     copy: the resumed run departs from the uninterrupted one, and ATOLL_CHECK_SNAPSHOT fails
//     the run naming the tensor. These two show that the first test can fail.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using nlohmann::json;
using Rows = std::map<std::tuple<int, int, int64_t>, std::pair<double, std::string>>;

// Every worker's first save copies slowly.
constexpr const char* kSlowCopy =
    "ATOLL_FAULT=delay:island=0:ckpt=copy:save=1:seconds=1,delay:island=1:ckpt=copy:save=1:seconds=1";

class CheckpointOverlap : public CliTest {
 protected:
  std::vector<std::string> args(const std::string& run, bool resume) const {
    std::vector<std::string> a = {"launch", "--islands", "2", "--workers-per-island", "2", "--config",
                                  world().config(), "--run-dir", run};
    for (const char* kv : {"train.steps=8", "train.eval_every=0", "checkpoint.every=4", "checkpoint.keep=2",
                           "diloco.inner_steps=2", "optim.warmup_steps=2", "fault.max_restarts=0"})
      a.insert(a.end(), {"--set", kv});
    if (resume) a.push_back("--resume");
    return a;
  }
  // Runs with `env` added to the children's environment.
  RunResult run_with(const std::vector<std::string>& env, const std::vector<std::string>& a) {
    for (const std::string& e : env) child_env().push_back(e);
    const RunResult r = run_atoll(a, 120);
    for (size_t i = 0; i < env.size(); ++i) child_env().pop_back();
    return r;
  }
  static Rows rows(const std::string& run) {
    Rows r;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl")) {
      const auto key = std::make_tuple(row["island"].get<int>(), row["rank"].get<int>(), row["step"].get<int64_t>());
      r[key] = {row["loss"].get<double>(), row.value("theta_hash", "")};
    }
    return r;
  }
  // The run copied as it stood at its checkpoint of step 4, then resumed from there to the end.
  Rows resumed_from_step_4(const std::string& run, const std::string& name) {
    const std::string cut = dir(name);
    fs::copy(run, cut, fs::copy_options::recursive);
    for (const auto& e : fs::directory_iterator(cut + "/checkpoints"))
      if (e.path().filename().string() != "step-00000004") fs::remove_all(e.path());
    std::ofstream(cut + "/checkpoints/latest") << "step-00000004\n";
    const RunResult r = run_atoll(args(cut, true), 120);
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    return rows(cut);
  }
  // How many of the 16 rows of steps 5..8 differ between the two runs.
  static int differing_rows(const Rows& a, const Rows& b) {
    int n = 0;
    for (int i = 0; i < 2; ++i)
      for (int r = 0; r < 2; ++r)
        for (int64_t step = 5; step <= 8; ++step) {
          const auto key = std::make_tuple(i, r, step);
          EXPECT_TRUE(a.count(key) && b.count(key)) << "island " << i << " rank " << r << " step " << step;
          if (a.count(key) && b.count(key) && a.at(key) != b.at(key)) ++n;
        }
    return n;
  }
};

TEST_F(CheckpointOverlap, ASlowCopyStillSavesTheStateOfItsStep) {
  const std::string run = dir("run");
  const RunResult r = run_with({kSlowCopy, "ATOLL_CHECK_SNAPSHOT=1"}, args(run, false));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  int fenced = 0;  // the step after the save waited for the copy at its fence
  for (const auto& row : read_jsonl(run + "/metrics.jsonl"))
    if (row["step"] == 5 && row.contains("ckpt_fence_s")) fenced += row["ckpt_fence_s"].get<double>() > 0;
  EXPECT_EQ(fenced, 4) << "every worker's step 5 reports its wait at the fence";
  const Rows full = rows(run);
  ASSERT_EQ(full.size(), 32u);
  EXPECT_EQ(differing_rows(full, resumed_from_step_4(run, "resumed")), 0);
}

TEST_F(CheckpointOverlap, WithoutTheFenceTheCheckpointHoldsALaterState) {
  const std::string run = dir("run");
  const RunResult r = run_with({kSlowCopy, "ATOLL_TEST_SKIP_CKPT_FENCE=1"}, args(run, false));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const Rows full = rows(run);
  ASSERT_EQ(full.size(), 32u);
  EXPECT_GT(differing_rows(full, resumed_from_step_4(run, "resumed")), 0)
      << "the slow copy no longer races the next step: the fence test above proves nothing";
}

TEST_F(CheckpointOverlap, WithoutTheFenceTheSnapshotCheckFailsTheRun) {
  const RunResult r =
      run_with({kSlowCopy, "ATOLL_TEST_SKIP_CKPT_FENCE=1", "ATOLL_CHECK_SNAPSHOT=1"}, args(dir("run"), false));
  EXPECT_NE(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.err.find("changed between save() and its copy"), std::string::npos) << r.describe();
}

}  // namespace
}  // namespace atl::testing
