// A worker's phase reports (core/worker_phase.h): each change once, none without a sink.
#include "atoll/core/worker_phase.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace atl {
namespace {

TEST(WorkerPhase, ReportsEachChangeOnce) {
  std::vector<std::string> seen;
  set_phase_sink([&](const char* name) { seen.push_back(name); });
  for (WorkerPhase p : {WorkerPhase::kJoining, WorkerPhase::kTraining, WorkerPhase::kTraining, WorkerPhase::kExchanging,
                        WorkerPhase::kRecovering, WorkerPhase::kRecovering, WorkerPhase::kTraining})
    enter_phase(p);
  EXPECT_EQ(seen, (std::vector<std::string>{"joining", "training", "exchanging", "recovering", "training"}));
  set_phase_sink({});
  enter_phase(WorkerPhase::kExchanging);  // nowhere, and no crash
  EXPECT_EQ(seen.size(), 5u);
}

}  // namespace
}  // namespace atl
