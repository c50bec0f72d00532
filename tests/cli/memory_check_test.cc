// A model or batch too large for the machine is refused at once by every command that trains
// (train, launch, worker, bench): one error line naming the keys that drive the size, the
// estimate, the memory available and the fix, before any data is prepared or any run folder
// made, instead of std::bad_alloc after the data preparation.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

// About 52 TB of parameters, with data still to prepare into the test's own folder.
std::vector<std::string> absurd(const std::string& data_dir) {
  return {"--set", "model.dim=16384",         "--set", "model.n_layers=64",
          "--set", "model.n_experts=64",      "--set", "model.expert_hidden=65536",
          "--set", "data.dir=\"" + data_dir + "\""};
}

class MemoryCheck : public CliTest {
 protected:
  // Runs `args`; the refusal must be clear, and nothing made: no data, no run folder.
  void expect_refused(std::vector<std::string> args) {
    const std::vector<std::string> sets = absurd(dir("data"));
    args.insert(args.end(), sets.begin(), sets.end());
    const auto before = snapshot(dir());
    const RunResult r = run_atoll(args, 60);
    EXPECT_TRUE(fails_clearly(r, {"model.dim", "model.expert_hidden", "TiB", "available", "/proc/meminfo",
                                  "train.memory_check = false"}));
    EXPECT_TRUE(unchanged(before, snapshot(dir())));
    EXPECT_FALSE(fs::exists(dir("data"))) << "the data was prepared before the refusal";
  }
};

TEST_F(MemoryCheck, TrainRefusesBeforePreparingData) {
  expect_refused({"train", "--config", world().config(), "--run-dir", dir("run"), "--no-sample"});
}

TEST_F(MemoryCheck, LaunchRefusesBeforeStartingWorkers) {
  expect_refused({"launch", "--islands", "2", "--config", world().config(), "--run-dir", dir("run")});
}

TEST_F(MemoryCheck, WorkerRefusesBeforeMeetingItsPeers) {
  expect_refused({"worker", "--store", "redis://127.0.0.1:1", "--island", "0", "--rank", "0", "--islands", "1",
                  "--config", world().config(), "--run-dir", dir("run")});
}

TEST_F(MemoryCheck, BenchRefusesBeforeAllocating) {
  expect_refused({"bench", "--config", world().config()});
}

// The launcher counts every worker it would start on this machine.
TEST_F(MemoryCheck, LaunchCountsEveryWorker) {
  const RunResult r = run_atoll({"launch", "--islands", "256", "--workers-per-island", "256", "--config",
                                 world().config(), "--run-dir", dir("run"), "--set", "model.vocab_size=65536",
                                 "--set", "model.dim=1024"},
                                60);
  EXPECT_TRUE(fails_clearly(r, {"65536 worker processes", "available"}));
  EXPECT_FALSE(fs::exists(dir("run")));
}

}  // namespace
}  // namespace atl::testing
