// A worker stopped from outside (SIGSTOP, at no chosen point: mid inner steps, most likely) past
// the heartbeat ttl is out: the others' next outer step times out, they re-form without it and go
// on. Let go (SIGCONT), it finds itself dropped (its epoch is stale), leaves with exit 75, and the
// launcher restarts it to rejoin; the run ends with exit 0 and equal hashes.
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

TEST_F(ElasticLaunch, AWorkerStoppedFromOutsideIsDroppedAndRejoinsWhenLetGo) {
  const std::string run = dir("run");
  Background b(args(run), dir("launch"));
  ASSERT_TRUE(wait_until([&] { return newest_outer_step(run) >= 3; }, 120, [&] { return b.running(); }))
      << read_file(dir("launch") + ".err");
  const pid_t victim = worker_pid(b.pid(), 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  const int64_t stopped_at = newest_outer_step(run);
  ASSERT_TRUE(wait_until([&] { return newest_outer_step(run) >= stopped_at + 5; }, 60, [&] { return b.running(); }))
      << "the others did not go on without it\n" << read_file(dir("launch") + ".err");
  ASSERT_EQ(process_state(victim), 'T') << "still stopped while the others went on";
  ASSERT_EQ(::kill(victim, SIGCONT), 0);
  ASSERT_TRUE(ends_with_exit_0(b));
  const RunView v = read_run(run);
  expect_agreement(v);
  ASSERT_GE(v.count("abort_retry"), 1u);
  EXPECT_EQ(v.events.at("abort_retry")[0]["lost"], nlohmann::json::array({1}));
  ASSERT_EQ(v.count("peer_lost"), 1u);
  EXPECT_EQ(v.events.at("peer_lost")[0]["status"], "exit 75") << "it left on its own once let go";
  EXPECT_EQ(v.count("join"), 1u);
  EXPECT_EQ(steps_with(v, 3).back(), kSteps / kH) << "whole again at the end";
}

}  // namespace
}  // namespace atl
