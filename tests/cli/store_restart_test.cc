// The launcher's redis-server killed (SIGKILL, from outside) twice in the middle of a 3-island
// run: the launcher starts it again on its port with its password (event store_restart), the
// workers reconnect and write back what the run needs (views, votes, records, the run token),
// and the run ends with exit 0, every outer step once, with equal θ and momentum hashes.
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

TEST_F(ElasticLaunch, TheStoreKilledMidRunIsRestartedAndTheRunCompletes) {
  const std::string run = dir("run");
  Background b(args(run), dir("launch"));
  for (const int64_t at : {3, 40}) {
    ASSERT_TRUE(wait_until([&] { return newest_outer_step(run) >= at; }, 120, [&] { return b.running(); }))
        << read_file(dir("launch") + ".err");
    const pid_t redis = store_pid(b.pid());
    ASSERT_GT(redis, 0) << "no redis-server under the launcher";
    ASSERT_EQ(::kill(redis, SIGKILL), 0);
    ASSERT_TRUE(wait_until([&] { const pid_t p = store_pid(b.pid()); return p > 0 && p != redis; }, 30,
                           [&] { return b.running(); }))
        << "not restarted\n" << read_file(dir("launch") + ".err");
  }
  ASSERT_TRUE(ends_with_exit_0(b));
  const RunView v = read_run(run);
  expect_agreement(v);
  ASSERT_EQ(v.count("store_restart"), 2u);
  EXPECT_EQ(v.events.at("store_restart")[0]["status"], "signal 9");
  EXPECT_EQ(steps_with(v, 3).back(), kSteps / kH) << "every island to the end";
  EXPECT_EQ(v.count("peer_lost"), 0u) << "no worker lost to the restart: " << read_file(dir("launch") + ".err");
}

}  // namespace
}  // namespace atl
