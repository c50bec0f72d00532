// Stragglers through `atoll launch` (3 islands, micro model, real processes): island 2 sleeps
// before its exchange of outer step 3 (ATOLL_FAULT delay, its heartbeat going on) for longer
// than fault.outer_deadline_s. The round closes without it and commits over islands 0 and 1;
// `straggler` names it; it finds the round closed, leaves, is restarted and rejoins with the
// committed state; every outer step ends with equal hashes and the run exits 0.
#include <gtest/gtest.h>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

TEST_F(ElasticLaunch, ALateIslandIsLeftOutOfTheRoundAndRejoinsWithTheCommittedState) {
  const std::string run = dir("run");
  child_env().push_back("ATOLL_FAULT=delay:island=2:outer_step=3:seconds=2");
  const RunResult r = run_atoll(args(run, {"--set", "fault.outer_deadline_s=0.5"}), 90);
  child_env().pop_back();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const RunView v = read_run(run);
  expect_agreement(v);
  ASSERT_EQ(v.count("straggler"), 1u) << r.describe();
  const nlohmann::json& s = v.events.at("straggler")[0];
  EXPECT_EQ(s["island"], 2) << s.dump();
  EXPECT_EQ(s["outer_step"], 3) << s.dump();
  EXPECT_GE(s["late_s"].get<double>(), 0.5) << s.dump();
  ASSERT_EQ(v.count("abort_retry"), 1u);
  EXPECT_EQ(v.events.at("abort_retry")[0]["lost"], nlohmann::json::array({2}));
  EXPECT_EQ(v.count("restart"), 1u);
  ASSERT_EQ(v.count("join"), 1u) << r.describe();
  const std::vector<int64_t> fewer = steps_with(v, 2), whole = steps_with(v, 3);
  ASSERT_FALSE(fewer.empty());
  EXPECT_EQ(fewer.front(), 3) << "outer step 3 committed without the late island";
  EXPECT_GT(whole.back(), fewer.back()) << "whole again after the rejoin";
  EXPECT_NE((r.out + r.err).find("was late for outer step 3"), std::string::npos) << r.describe();
}

// Without a deadline (the default) the same delay is waited for: no straggler, no restart.
TEST_F(ElasticLaunch, WithoutADeadlineALateIslandIsWaitedFor) {
  const std::string run = dir("run");
  child_env().push_back("ATOLL_FAULT=delay:island=2:outer_step=3:seconds=1");
  const RunResult r = run_atoll(args(run, {"--set", "train.steps=80"}), 60);
  child_env().pop_back();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const RunView v = read_run(run);
  expect_agreement(v, 80 / kH);
  EXPECT_EQ(v.count("straggler"), 0u);
  EXPECT_EQ(v.count("restart"), 0u);
  EXPECT_EQ(steps_with(v, 3).size(), size_t(80 / kH));
}

}  // namespace
}  // namespace atl::testing
