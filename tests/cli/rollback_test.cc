// Rollback through `atoll launch` (micro model, real processes): one worker's loss reads as NaN,
// or as a spike (ATOLL_FAULT corrupt:...:step=K:loss=nan|spike); its island rolls back to θ at
// its last outer step and skips the batch, `rollback` is logged, the run completes with exit 0,
// every outer step ends with equal hashes and the final validation loss is finite. With two
// workers per island and the NaN on rank 1 only, rank 0 logs the rollback: the island decided
// on its mean loss, so both ranks rolled back alike.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

class Rollback : public ShortLaunch {
 protected:
  Outcome run(const std::string& name, const std::string& fault, const std::vector<std::string>& extra = {}) {
    Outcome o = ShortLaunch::run(name, fault, {"rollback"}, extra);
    EXPECT_TRUE(std::isfinite(o.val_loss) && o.val_loss > 0) << name << ": val_loss " << o.val_loss;
    return o;
  }
};

TEST_F(Rollback, ANonFiniteLossRollsTheIslandBackAndTheRunCompletes) {
  const Outcome o = run("nan", "corrupt:island=1:step=10:loss=nan");
  ASSERT_EQ(o.events.size(), 1u) << o.describe;
  const nlohmann::json& e = o.events[0];
  EXPECT_EQ(e["island"], 1) << e.dump();
  EXPECT_EQ(e["step"], 10) << e.dump();
  EXPECT_EQ(e["outer_step"], 2) << e.dump();
  EXPECT_EQ(e["reason"], "not finite") << e.dump();
}

TEST_F(Rollback, ALossSpikeRollsTheIslandBack) {
  const Outcome o = run("spike", "corrupt:island=2:step=30:loss=spike",
                        {"--set", "fault.spike_factor=3", "--set", "fault.spike_window=8"});
  ASSERT_EQ(o.events.size(), 1u) << o.describe;
  const nlohmann::json& e = o.events[0];
  EXPECT_EQ(e["island"], 2) << e.dump();
  EXPECT_EQ(e["step"], 30) << e.dump();
  EXPECT_EQ(e["reason"], "spike") << e.dump();
  EXPECT_GT(e["loss"].get<double>(), 3 * e["median"].get<double>()) << e.dump();
}

TEST_F(Rollback, EveryWorkerOfTheIslandRollsBackAlike) {
  const Outcome o = run("island", "corrupt:island=1:rank=1:step=10:loss=nan", {"--workers-per-island", "2"});
  ASSERT_EQ(o.events.size(), 1u) << o.describe;
  EXPECT_EQ(o.events[0]["island"], 1) << o.events[0].dump();
  EXPECT_EQ(o.events[0]["rank"], 0) << "rank 0's own loss was finite: it rolled back on the island's mean";
}

}  // namespace
}  // namespace atl::testing
