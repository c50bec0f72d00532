// A rendezvous gives up on a member known gone (GroupOptions::lost_ranks: in a run, its heartbeat
// lapsed) with PeerLost naming it, whether it never arrived or arrived and died before it gave its
// address; a member only slow (not known gone) is waited for and the group forms. A ring mean
// gives up the same way on a member that stops answering once it is known gone, long before the
// timeout, and so do the group's own collectives (barrier, allgather, reduce-scatter). Every rank
// a real process; "gone" is a store key, which lost_ranks reads.
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

class GroupLostMember : public testing::RedisSuite {
 protected:
  // Ranks 0 and 1 form a group of 3 whose rank 2 runs `rank2` instead (with the store); a timeout
  // far longer than the test, so that only giving up early ends their rendezvous in time.
  template <class Rank2>
  static std::vector<std::string> form_without_rank_2(const std::string& run, Rank2&& rank2) {
    return run_processes(3, [&](int rank) {
      Store store(store_options(run));
      const std::string gone = store.run_prefix() + "/gone/2";
      if (rank == 2) {
        rank2(store);
        store.set(gone, "1");
        return std::string("gone");
      }
      const std::string r = testing::outcome(60, [&] {
        ProcessGroup g(store, GroupOptions{.rank = rank, .size = 3, .timeout = milliseconds(20000),
                                           .member_name = [](int r) { return "member-" + std::to_string(r); },
                                           .lost_ranks = [&] {
                                             return store.get(gone) ? std::vector<int>{2} : std::vector<int>{};
                                           }});
      });
      return r == "completed" ? std::string("formed") : r;
    });
  }
};

TEST_F(GroupLostMember, OneThatNeverArrivesIsGivenUpOnceGone) {
  const auto out = form_without_rank_2("never", [](Store&) {});
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(out[size_t(r)].rfind("PeerLost: ", 0), 0u) << out[size_t(r)];
    EXPECT_NE(out[size_t(r)].find("member-2 gone"), std::string::npos) << out[size_t(r)];
  }
}

TEST_F(GroupLostMember, OneThatArrivedAndDiedBeforeItsAddressIsGivenUpOnceGone) {
  const auto out = form_without_rank_2("arrived", [](Store& store) {
    const std::string prefix = store.group_prefix("world", 0);
    store.set_if_absent(prefix + "/arrived/2", "127.0.0.1");
    store.set(prefix + "/size/2", "3");
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(out[size_t(r)].rfind("PeerLost: ", 0), 0u) << out[size_t(r)];
    EXPECT_NE(out[size_t(r)].find("waiting for the peers' addresses: member-2 gone"), std::string::npos)
        << out[size_t(r)];
  }
}

// Rank 2 arrives only after both others have asked whether it is gone (and were told no).
TEST_F(GroupLostMember, OneThatIsOnlySlowIsWaitedFor) {
  const auto out = run_processes(3, [&](int rank) {
    Store store(store_options("slow"));
    const std::string asked = store.run_prefix() + "/asked/";
    if (rank == 2) store.wait({asked + "0", asked + "1"});
    bool told = false;
    try {
      ProcessGroup g(store, GroupOptions{.rank = rank, .size = 3, .timeout = milliseconds(20000),
                                         .lost_ranks = [&] {
                                           if (!told) store.set(asked + std::to_string(rank), "1"), told = true;
                                           return std::vector<int>{};
                                         }});
      g.barrier();
      return std::string("formed");
    } catch (const std::exception& e) {
      return std::string("failed: ") + e.what();
    }
  });
  EXPECT_EQ(out, (std::vector<std::string>{"formed", "formed", "formed"}));
}

// Rank 2 forms the group and then stops answering without closing its connections (a stopped or
// cut-off member). A ring mean, the group's own collectives (barrier, all-gather, reduce-scatter,
// a broadcast from rank 2) and a send to or receive from rank 2, as its peers see them: once it
// is known gone each gives up with PeerLost naming it, not after the 20 s timeout (Timeout), and
// the buffers are unchanged.
class GroupCollectiveLostMember : public GroupLostMember, public ::testing::WithParamInterface<std::string> {};

TEST_P(GroupCollectiveLostMember, GivesUpOnAMemberOnceItIsKnownGone) {
  const std::string op = GetParam();
  const auto out = run_processes(3, [&](int rank) {
    Store store(store_options("collective-" + op));
    const std::string gone = store.run_prefix() + "/gone/2", done = store.run_prefix() + "/done/";
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = 3, .timeout = milliseconds(20000),
                                       .member_name = [](int r) { return "member-" + std::to_string(r); },
                                       .lost_ranks = [&] {
                                         return store.get(gone) ? std::vector<int>{2} : std::vector<int>{};
                                       }});
    store.set(store.run_prefix() + "/formed/" + std::to_string(rank), "1");
    if (rank == 2) {  // silent, its connections open, until the others are done
      store.wait({store.run_prefix() + "/formed/0", store.run_prefix() + "/formed/1"});
      store.set(gone, "1");
      store.wait({done + "0", done + "1"});
      return std::string("silent");
    }
    std::vector<float> x(3000, float(rank + 1));
    std::string result = testing::outcome(10, [&] {
      if (op == "ring") RingAllreduce(g, RingOptions{.codec = Codec::kInt8}).mean(x.data(), x.size());
      if (op == "barrier") g.barrier();
      if (op == "allgather") g.allgather(std::string(100, char('a' + rank)));
      if (op == "reduce_scatter_sum") g.reduce_scatter_sum(x.data(), {1000, 1000, 1000});
      if (op == "broadcast") g.broadcast(x.data(), x.size() * sizeof(float), 2);  // from the silent one
      if (op == "send" && rank == 0) g.send(x.data(), x.size() * sizeof(float), 2);
      if (op == "send" && rank == 1) g.recv(x.data(), x.size() * sizeof(float), 2);
    });
    if (x != std::vector<float>(3000, float(rank + 1))) result += " (buffer changed)";
    store.set(done + std::to_string(rank), "1");
    store.wait({done + "0", done + "1"});  // connections open until both gave up on their own
    return result;
  });
  EXPECT_EQ(out[2], "silent");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(out[size_t(r)].rfind("PeerLost: ", 0), 0u) << out[size_t(r)];
    const std::string named = op == "ring" ? "ring mean" : op == "send" ? (r == 0 ? "send" : "recv") : op;
    EXPECT_NE(out[size_t(r)].find(named), std::string::npos) << out[size_t(r)];
    EXPECT_NE(out[size_t(r)].find("member-2 gone"), std::string::npos) << out[size_t(r)];
    EXPECT_EQ(out[size_t(r)].find("(after"), std::string::npos) << out[size_t(r)];
    EXPECT_EQ(out[size_t(r)].find("buffer changed"), std::string::npos) << out[size_t(r)];
  }
}

INSTANTIATE_TEST_SUITE_P(Collectives, GroupCollectiveLostMember,
                         ::testing::Values("ring", "barrier", "allgather", "reduce_scatter_sum", "broadcast", "send"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace atl
