// fault.max_restarts caps a worker's restarts in a row without progress (a crash loop), not over
// the run: with a cap of 1, island 2 killed twice, rejoining and training in between, is
// restarted twice and the run ends with exit 0 (the cap counted every restart of the run before,
// and a long run ended at a worker's fourth loss whatever it did in between); a worker that dies
// at the start of every restart (ATOLL_FAULT=kill:...:join=start) still ends the run after the
// cap, with one line that names the worker, the count and the key.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

class RestartCap : public ElasticLaunch {
 protected:
  // Island 2 took part in an outer step after `outer_step`.
  static bool contributed_since(const std::string& run, int64_t outer_step) {
    const RunView v = read_run(run);
    for (auto it = v.theta.upper_bound(outer_step); it != v.theta.end(); ++it)
      if (it->second.count(2)) return true;
    return false;
  }
};

TEST_F(RestartCap, AWorkerLostMoreOftenThanTheCapWithProgressInBetweenKeepsTheRunGoing) {
  const std::string run = dir("run");
  Background b(args(run, {"--set", "fault.max_restarts=1"}), dir("launch"));
  const auto alive = [&] { return b.running(); };
  int64_t since = 2;
  for (int loss = 1; loss <= 2; ++loss) {
    ASSERT_TRUE(wait_until([&] { return contributed_since(run, since); }, 60, alive)) << read_file(dir("launch") + ".err");
    const pid_t victim = worker_pid(b.pid(), 2);
    ASSERT_GT(victim, 0);
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    // Rejoined: the next loss comes after an outer step it took part in since.
    ASSERT_TRUE(wait_until([&] { return read_run(run).count("join") == size_t(loss); }, 60, alive))
        << read_file(dir("launch") + ".err");
    since = read_run(run).events.at("join").back()["outer_step"].get<int64_t>() + 1;
  }
  ASSERT_TRUE(ends_with_exit_0(b));
  const RunView v = read_run(run);
  expect_agreement(v);
  EXPECT_EQ(v.count("restart"), 2u);
  EXPECT_EQ(steps_with(v, 3).back(), kSteps / kH) << "whole again at the end";
}

TEST_F(RestartCap, AWorkerThatDiesAtEveryRestartEndsTheRunAfterTheCap) {
  const std::string run = dir("run");
  child_env().push_back("ATOLL_FAULT=kill:island=2:outer_step=2:ring_chunk=1,kill:island=2:join=start");
  const RunResult r = run_atoll(args(run, {"--set", "fault.max_restarts=2"}), 90);
  child_env().pop_back();
  EXPECT_TRUE(fails_clearly(r, {"island 2 rank 0 failed (signal 9) after 2 restart(s) in a row without a new step "
                                "(fault.max_restarts = 2), every worker stopped"}));
  const RunView v = read_run(run);
  EXPECT_EQ(v.count("restart"), 2u);
  EXPECT_EQ(v.count("peer_lost"), 3u);
  EXPECT_EQ(v.count("worker_failed"), 1u);
}

}  // namespace
}  // namespace atl::testing
