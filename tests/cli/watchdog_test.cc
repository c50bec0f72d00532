// The watchdog through `atoll launch` (3 islands, micro model, real processes): island 1 sleeps
// inside a step (ATOLL_FAULT stall: its heartbeat thread goes on, so membership still counts it
// alive) for far longer than fault.step_timeout_s. The launcher sees its progress mark age past
// the timeout, kills it, and restarts it (`restart` with reason `watchdog`); it rejoins, every
// outer step ends with equal hashes, and the run exits 0.
#include <gtest/gtest.h>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

TEST_F(ElasticLaunch, AWorkerHungInAStepIsKilledAndRestartedByTheWatchdog) {
  const std::string run = dir("run");
  child_env().push_back("ATOLL_FAULT=stall:island=1:step=30:seconds=300");
  // step_timeout_s above 2 x timeout_s: the islands that wait for the hung one (the ring's
  // timeout, then re-forming) are not taken for hung themselves.
  // The fixture's 1200 steps: the others train on for several seconds after the kill, so the
  // restarted island has the time to rejoin on any machine (with 240 an idle one finished first).
  const RunResult r =
      run_atoll(args(run, {"--set", "fault.timeout_s=3", "--set", "fault.step_timeout_s=10"}), 120);
  child_env().pop_back();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const RunView v = read_run(run);
  expect_agreement(v);
  ASSERT_EQ(v.count("restart"), 1u) << r.describe();
  const nlohmann::json& restart = v.events.at("restart")[0];
  EXPECT_EQ(restart["island"], 1) << restart.dump();
  EXPECT_EQ(restart["reason"], "watchdog") << restart.dump();
  ASSERT_EQ(v.count("peer_lost"), 1u);
  EXPECT_EQ(v.events.at("peer_lost")[0]["status"], "signal 9");
  EXPECT_EQ(v.count("join"), 1u) << r.describe();
  EXPECT_NE((r.out + r.err).find("killed by the watchdog"), std::string::npos) << r.describe();
}

}  // namespace
}  // namespace atl::testing
