// Bad updates from a peer through `atoll launch` (3 islands, micro model, real processes): one
// island sends a NaN, a 10^6-times-scaled, a sign-flipped or a replayed (stale) Δ at one outer
// step (ATOLL_FAULT corrupt:...:update=...): dropped (NaN, stale, opposed direction) or clipped. θ stays finite, every outer step ends with equal
// hashes, the drop or clip is in events.jsonl, and the final validation loss is within 1% of
// the clean run's.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

class BadUpdates : public CliTest {
 protected:
  struct Outcome {
    double val_loss = 0;
    std::vector<nlohmann::json> events;
    std::string describe;
  };

  // 48 steps, H = 4: twelve outer steps; `fault` corrupts island 1's Δ at outer step 6.
  Outcome run(const std::string& name, const std::string& fault) {
    const std::string run = dir(name);
    if (!fault.empty()) child_env().push_back("ATOLL_FAULT=corrupt:island=1:outer_step=6:update=" + fault);
    const RunResult r = run_atoll({"launch", "--islands", "3", "--config", world().config(), "--run-dir", run,
                                   "--set", "train.steps=48", "--set", "diloco.inner_steps=4", "--set",
                                   "train.eval_every=48", "--set", "checkpoint.every=0", "--set", "optim.warmup_steps=0"},
                                  60);
    if (!fault.empty()) child_env().pop_back();
    Outcome o;
    o.describe = r.describe();
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    std::map<int64_t, std::set<std::string>> hashes;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl")) {
      if (row.contains("val_loss")) o.val_loss = row["val_loss"].get<double>();
      if (row.contains("theta_hash")) hashes[row["outer_step"].get<int64_t>()].insert(row["theta_hash"]);
    }
    EXPECT_EQ(hashes.size(), 12u) << name;
    for (const auto& [step, h] : hashes) EXPECT_EQ(h.size(), 1u) << name << ": outer step " << step;
    for (const auto& e : read_jsonl(run + "/events.jsonl"))
      if (e["event"] == "dropped_update" || e["event"] == "clipped_update") o.events.push_back(e);
    return o;
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
    EXPECT_LT(std::abs(o.val_loss - clean.val_loss) / clean.val_loss, 0.01)
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
