// Bad updates from a peer through `atoll launch` (3 islands, micro model, real processes): one
// island sends a NaN, a 10^6-times-scaled, a sign-flipped or a replayed (stale) Δ at one outer
// step (ATOLL_FAULT corrupt:...:update=...): dropped (NaN, stale, opposed direction) or clipped. θ stays finite, every outer step ends with equal
// hashes, the drop or clip is in events.jsonl, and the final validation loss is at most 1% above
// the clean run's.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

// `fault` corrupts island 1's Δ at outer step 6.
class BadUpdates : public ShortLaunch {
 protected:
  Outcome run(const std::string& name, const std::string& fault) {
    return ShortLaunch::run(name, fault.empty() ? "" : "corrupt:island=1:outer_step=6:update=" + fault,
                            {"dropped_update", "clipped_update"});
  }
};

TEST_F(BadUpdates, ABadDeltaFromOneIslandLeavesTheRunWithinOnePercentOfTheCleanOne) {
  const Outcome clean = run("clean", "");
  ASSERT_GT(clean.val_loss, 0) << clean.describe;
  EXPECT_TRUE(clean.events.empty()) << clean.events.front().dump();
  const struct {
    const char* fault;
    const char* event;  // "" = none expected
  } cases[] = {{"nan", "dropped_update"}, {"scale", "clipped_update"}, {"replay", "dropped_update"}, {"flip", "dropped_update"}};
  for (const auto& c : cases) {
    const Outcome o = run(c.fault, c.fault);
    EXPECT_TRUE(std::isfinite(o.val_loss)) << c.fault;
    // Harm is a higher loss: a clipped Δ changes the trajectory and may end lower (the scaled
    // case ends 1.08% below the clean run on a Zen 5 machine, identical from 8196d46 on), which
    // is no damage to the run.
    EXPECT_LT((o.val_loss - clean.val_loss) / clean.val_loss, 0.01)
        << c.fault << ": val_loss " << o.val_loss << " against " << clean.val_loss;
    if (*c.event == '\0') {
      EXPECT_TRUE(o.events.empty()) << c.fault << ": " << (o.events.empty() ? "" : o.events.front().dump());
      continue;
    }
    ASSERT_EQ(o.events.size(), 1u) << c.fault << "\n" << o.describe;
    EXPECT_EQ(o.events[0]["event"], c.event) << o.events[0].dump();
    EXPECT_EQ(o.events[0]["island"], 1) << o.events[0].dump();
    EXPECT_EQ(o.events[0]["outer_step"], 6) << o.events[0].dump();
    if (std::string(c.fault) == "flip") {
      EXPECT_NE(o.events[0]["why"].get<std::string>().find("opposed: cosine"), std::string::npos) << o.events[0].dump();
    }
    if (std::string(c.fault) == "replay") {
      EXPECT_NE(o.events[0]["why"].get<std::string>().find("stale: computed from outer step 5"), std::string::npos)
          << o.events[0].dump();
    }
  }
}

}  // namespace
}  // namespace atl::testing
