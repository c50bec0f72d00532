// What a process group says when its members disagree or one stalls, every member a real
// process: ranks started with different group sizes are named, with each one's size, instead of
// Gloo's "sizeof(impl_) == bytes.size(). 136 vs 68"; a collective that times out because one
// member stalled names that member (GroupOptions::member_name: "island 2 rank 0" in a run), in
// Gloo's collectives and in the quantized ring.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "atoll/core/errors.h"
#include "atoll/dist/group.h"
#include "atoll/dist/ring_allreduce.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using std::chrono::milliseconds;
using testing::run_processes;

class GroupErrors : public testing::RedisSuite {
 protected:
  // Rank 2 lives but never enters the collective (it waits until the others have given up).
  template <class Collective>
  static std::vector<std::string> stall_rank_2(const std::string& run, Collective&& collective) {
    // The group's timeout bounds every message (a member that times out on it may close its
    // connections: its neighbours then see a lost peer, and still must not be named).
    return run_processes(3, [&](int rank) {
      Store store(store_options(run));
      ProcessGroup g(store, GroupOptions{.rank = rank,
                                         .size = 3,
                                         .timeout = milliseconds(1000),
                                         .member_name = [](int r) { return "member-" + std::to_string(r); }});
      const std::vector<std::string> done = {store.run_prefix() + "/done0", store.run_prefix() + "/done1"};
      if (rank == 2) {
        store.wait(done);
        return std::string("released");
      }
      std::string what = "no error";
      try {
        collective(g);
      } catch (const Timeout& e) {
        what = std::string("Timeout: ") + e.what();
      } catch (const PeerLost& e) {
        what = std::string("PeerLost: ") + e.what();
      }
      store.set(store.run_prefix() + "/done" + std::to_string(rank), "1");
      store.wait(done);  // exiting earlier would close connections the other may still wait on
      return what;
    });
  }
};

TEST_F(GroupErrors, RanksStartedWithDifferentSizesAreNamed) {
  const auto out = run_processes(2, [&](int rank) {
    Store store(store_options("sizes"));
    try {
      ProcessGroup g(store, GroupOptions{.rank = rank, .size = rank == 0 ? 2 : 3, .timeout = milliseconds(20000)});
      return std::string("connected");
    } catch (const GroupSizeMismatch& e) {
      return "mismatch " + std::to_string(e.rank) + ":" + std::to_string(e.size) + " " + std::to_string(e.peer) + ":" +
             std::to_string(e.peer_size) + " | " + e.what();
    }
  });
  EXPECT_EQ(out[0].rfind("mismatch 0:2 1:3 | ", 0), 0u) << out[0];
  EXPECT_EQ(out[1].rfind("mismatch 1:3 0:2 | ", 0), 0u) << out[1];
  for (const auto& o : out) {
    EXPECT_NE(o.find("rank 1 was started with a group of 3, rank 0 with a group of 2"), std::string::npos) << o;
    EXPECT_NE(o.find("fix:"), std::string::npos) << o;
    EXPECT_EQ(o.find("enforce"), std::string::npos) << o;
  }
}

// Both other members name member 2 (a member whose neighbour closed its connections on a
// timeout sees a lost peer, and names no one).
void expect_names_member_2(const std::vector<std::string>& out) {
  EXPECT_EQ(out[2], "released");
  int timeouts = 0;
  for (int r = 0; r < 2; ++r) {
    if (out[r].rfind("PeerLost: ", 0) == 0) continue;
    ++timeouts;
    EXPECT_EQ(out[r].rfind("Timeout: ", 0), 0u) << out[r];
    EXPECT_NE(out[r].find("stalled: member-2"), std::string::npos) << out[r];
    EXPECT_EQ(out[r].find("member-0,"), std::string::npos) << out[r];
    EXPECT_EQ(out[r].find("stalled: member-0"), std::string::npos) << out[r];
    EXPECT_EQ(out[r].find("stalled: member-1"), std::string::npos) << out[r];
  }
  EXPECT_GE(timeouts, 1) << out[0] << "\n" << out[1];
}

TEST_F(GroupErrors, AStalledMemberIsNamedByTheOthersInABarrier) {
  expect_names_member_2(stall_rank_2("stall-barrier", [](ProcessGroup& g) { g.barrier(); }));
}

TEST_F(GroupErrors, AStalledMemberIsNamedByTheOthersInTheRing) {
  expect_names_member_2(stall_rank_2("stall-ring", [](ProcessGroup& g) {
    RingAllreduce ring(g, RingOptions{.codec = Codec::kInt8});
    std::vector<float> x(5000, 1.0f);
    ring.mean(x.data(), x.size());
  }));
}

}  // namespace
}  // namespace atl
