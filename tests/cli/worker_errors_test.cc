// Workers of one run that disagree or stall, through the real binary: a worker started with
// another --islands (or --workers-per-island) is named with both values and the fix, at once,
// instead of Gloo's "sizeof(impl_) == bytes.size(). 136 vs 68"; a worker stopped with SIGSTOP in
// the middle of training is named by the island that waited for it ("stalled: island 1 rank 0"),
// in the incident with which that island re-forms without it (docs/islands.md, elastic islands).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cli/store_fixture.h"

namespace atl::testing {
namespace {

class WorkerErrors : public CliTestWithStore {
 protected:
  // `atoll worker` for island `island` (rank 0) of a run of `islands`, in its own run folder.
  std::vector<std::string> worker(const std::string& run_id, int island, int islands,
                                  const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = {"worker", "--config", world().config(), "--store", redis_->url(), "--run-id",
                                     run_id, "--island", std::to_string(island), "--rank", "0", "--islands",
                                     std::to_string(islands), "--run-dir", dir("run-" + std::to_string(island)),
                                     "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
};

TEST_F(WorkerErrors, AWorkerWithAnotherIslandCountIsNamedWithBothValues) {
  base_run();  // the data, prepared before the workers start
  // fault.timeout_s = 60: the refusal must come from the sizes, not from a timeout.
  Background other(worker("islands", 1, 3, {"--set", "fault.timeout_s=60"}), dir("other"));
  const RunResult r = run_atoll(worker("islands", 0, 2, {"--set", "fault.timeout_s=60"}), 50);
  const std::vector<std::string> names = {"island 1 was started with --islands 3, island 0 with --islands 2",
                                          "fix:"};
  EXPECT_TRUE(fails_clearly(r, names));
  other.wait();
  const std::string other_err = read_file(dir("other") + ".err");
  EXPECT_NE(other_err.find(names[0]), std::string::npos) << other_err;
  EXPECT_EQ(other_err.find("enforce"), std::string::npos) << other_err;
}

TEST_F(WorkerErrors, AStoppedWorkerIsNamedByTheIslandThatWaitedForIt) {
  base_run();
  const std::vector<std::string> run = {"--set", "train.steps=100000", "--set", "diloco.inner_steps=2", "--set",
                                        "fault.timeout_s=2", "--set", "train.eval_every=0", "--set",
                                        "checkpoint.every=0"};
  Background island1(worker("stall", 1, 2, run), dir("island1"));
  Background island0(worker("stall", 0, 2, run), dir("island0"));
  // Once island 1 has logged a step it is training: stop it (alive, silent) and let island 0 wait.
  ASSERT_TRUE(wait_for_file(dir("run-1"), "metrics.jsonl", 60, [&] { return island1.running(); }));
  ASSERT_EQ(::kill(island1.pid(), SIGSTOP), 0);
  // Island 0 gives up on it, names it in its incident (elastic islands: it then goes on alone)
  // and re-forms without it.
  nlohmann::json retry;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (retry.is_null() && island0.running() && std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(dir("run-0") + "/events.jsonl"))
      for (const auto& e : read_jsonl(dir("run-0") + "/events.jsonl"))
        if (e["event"] == "abort_retry") retry = e;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  island0.kill9();
  island1.kill9();
  ASSERT_FALSE(retry.is_null()) << read_file(dir("island0") + ".err");
  EXPECT_EQ(retry["lost"], nlohmann::json::array({1})) << retry.dump();
  // Named as the ring's timeout does ("stalled: island 1 rank 0"), or as the heartbeat check does
  // when its ttl ran out before island 0 reached the exchange.
  EXPECT_NE(retry["why"].get<std::string>().find("island 1 rank 0"), std::string::npos) << retry.dump();
}

}  // namespace
}  // namespace atl::testing
