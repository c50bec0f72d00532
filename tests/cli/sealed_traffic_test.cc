// Sealed traffic between islands through `atoll launch` (3 islands, micro model, real processes;
// dist.seal on by default with the launcher's run token): one ring message of island 1 altered on
// the wire after sealing (ATOLL_FAULT corrupt:...:ring_chunk=K) is dropped by island 2 and named
// in a `forged_frame` event, the outer step is aborted and retried, and θ is not changed by it:
// every outer step's hash is the clean run's.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

class SealedTraffic : public ShortLaunch {
 protected:
  // theta_hash by outer step, of the run `name` (ShortLaunch checks they agree among islands).
  std::map<int64_t, std::string> hashes(const std::string& name) {
    std::map<int64_t, std::string> h;
    for (const auto& row : read_jsonl(dir(name) + "/metrics.jsonl"))
      if (row.contains("theta_hash")) h[row["outer_step"].get<int64_t>()] = row["theta_hash"];
    return h;
  }
};

TEST_F(SealedTraffic, AnAlteredFrameIsDroppedLoggedAndLeavesThetaAsTheCleanRunHasIt) {
  const Outcome clean = run("clean", "", {"forged_frame", "forged_record", "abort_retry"});
  EXPECT_TRUE(clean.events.empty()) << clean.events.front().dump();
  const Outcome tampered = run("tampered", "corrupt:island=1:outer_step=3:ring_chunk=2",
                               {"forged_frame", "forged_record", "abort_retry"});
  std::vector<nlohmann::json> forged, retried;
  for (const auto& e : tampered.events) (e["event"] == "forged_frame" ? forged : retried).push_back(e);
  ASSERT_EQ(forged.size(), 1u) << tampered.describe;
  EXPECT_EQ(forged[0]["island"], 2) << forged[0].dump();  // island 1's right neighbour in the ring
  EXPECT_EQ(forged[0]["peer"], "island 1 rank 0") << forged[0].dump();
  EXPECT_NE(forged[0]["why"].get<std::string>().find("failed authentication"), std::string::npos) << forged[0].dump();
  ASSERT_EQ(retried.size(), 1u) << tampered.describe;
  EXPECT_EQ(retried[0]["event"], "abort_retry");  // by the leader, with its own failure (its ring lost a peer)
  EXPECT_EQ(retried[0]["attempt"], "s3") << retried[0].dump();
  EXPECT_EQ(hashes("tampered"), hashes("clean")) << "the altered frame changed theta";
  EXPECT_EQ(tampered.val_loss, clean.val_loss);
}

}  // namespace
}  // namespace atl::testing
