// Streaming DiLoCo's driver with real processes (dist/streaming.h): one fragment, blocking, is
// exactly plain DiLoCo (the old loop written out here from its parts: same θ hash after every
// outer step); 2 and 3 fragments, blocking and overlapped, keep every island's θ bit-identical per
// fragment sync, each fragment syncing the scheduled number of times; a peer lost during an
// overlapped exchange surfaces on the main thread as PeerLost/Timeout naming the fragment, with θ
// and the momentum unchanged.
#include "atoll/dist/streaming.h"

#include <gtest/gtest.h>

#include <map>
#include <stdexcept>

#include "atoll/core/errors.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using testing::run_processes;
using testing::test_drift;
using testing::test_theta0;
using testing::test_value;

class StreamingTest : public testing::RedisSuite {};

// testing::fake_layout's tensors (three per block, plus embed, final norm and head) cut into P.
FragmentPlan plan_for(int layers, int P, size_t* total) {
  const std::vector<TensorSpan> spans = testing::fake_layout(layers, total);
  return plan_fragments(spans, *total, P);
}

TEST_F(StreamingTest, OneBlockingFragmentIsPlainDiloco) {
  const int N = 2;
  const int64_t H = 3, T = 10;  // syncs after steps 3, 6, 9 and the last step 10
  const auto out = run_processes(N, [&](int rank) {
    size_t n = 0;
    plan_for(3, 1, &n);
    const RingOptions ring{.codec = Codec::kInt8, .chunk_bytes = 4096};
    std::string ref, got;
    {  // The plain DiLoCo loop, written out from its parts.
      Store store(store_options("plain-ref"));
      ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = N});
      RingAllreduce r(g, ring);
      std::vector<float> theta = test_theta0(n), m(n, 0.0f), local = theta, delta(n);
      for (int64_t step = 1; step <= T; ++step) {
        test_drift(local, rank, step);
        if (step % H != 0 && step != T) continue;
        for (size_t i = 0; i < n; ++i) delta[i] = theta[i] - local[i];
        r.mean(delta.data(), n);
        outer_nesterov_step(theta.data(), m.data(), delta.data(), n, 0.7, 0.9);
        local = theta;
        ref += std::to_string(step) + ":" + hash_floats(theta.data(), n) + " ";
      }
    }
    {
      Store store(store_options("plain-stream"));
      ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = N});
      std::vector<float> local = test_theta0(n);
      DilocoSync sync(g, local.data(), n, {.ring = ring});
      StreamingDiloco s(sync, g, {.inner_steps = H});
      for (int64_t step = 1; step <= T; ++step) {
        test_drift(local, rank, step);
        const StreamStep st = s.after_step(step, T, local.data());
        if (st.synced) {
          EXPECT_EQ(st.synced->fragment, 0);
          got += std::to_string(step) + ":" + st.synced->theta_hash + " ";
        }
      }
      EXPECT_EQ(sync.outer_step(), 4);
    }
    EXPECT_EQ(got, ref);
    if (::testing::Test::HasFailure()) throw std::runtime_error("assertions failed in island " + std::to_string(rank));
    return got;
  });
  for (int r = 0; r < N; ++r) EXPECT_EQ(out[r].find("ERROR"), std::string::npos) << out[r];
  EXPECT_EQ(out[1], out[0]);
}

// Every island's sequence of (step, fragment, outer step, hash) is the same, each fragment syncs
// the scheduled number of times, the last sync covers everything, and with overlap the exchange
// really was in flight across inner steps.
TEST_F(StreamingTest, FragmentsAgreeAcrossIslandsBlockingAndOverlapped) {
  struct Case {
    int islands, layers, P, tau;
    int64_t H, T;
    bool ef;
  };
  for (const Case c : {Case{2, 3, 2, 0, 4, 13, false}, Case{2, 3, 2, 1, 4, 13, false}, Case{3, 5, 3, 0, 6, 20, false},
                       Case{3, 5, 3, 1, 6, 20, true}, Case{2, 4, 3, 2, 7, 23, false}}) {
    const std::string run = "frag-" + std::to_string(c.islands) + std::to_string(c.P) + std::to_string(c.tau) +
                            std::to_string(c.H) + (c.ef ? "ef" : "");
    const auto out = run_processes(c.islands, [&](int rank) {
      size_t n = 0;
      FragmentPlan plan = plan_for(c.layers, c.P, &n);
      Store store(store_options(run));
      ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = c.islands, .connections = 2});
      std::vector<float> local = test_theta0(n);
      DilocoSync sync(g, local.data(), n,
                      {.ring = {.codec = Codec::kInt8, .chunk_bytes = 4096, .error_feedback = c.ef}}, std::move(plan));
      StreamingDiloco s(sync, g, {.inner_steps = c.H, .overlap_steps = c.tau, .mixing = 0.5});
      std::string log;
      std::map<int, int> started, finished;
      int last_started = -1;
      for (int64_t step = 1; step <= c.T; ++step) {
        test_drift(local, rank, step);
        const StreamStep st = s.after_step(step, c.T, local.data());
        if (st.synced) {
          finished[st.synced->fragment]++;
          log += std::to_string(step) + "/" + std::to_string(st.synced->fragment) + "/" +
                 std::to_string(st.synced->outer_step) + "/" + st.synced->theta_hash + " ";
          if (c.tau > 0 && step < c.T) {
            EXPECT_EQ(st.synced->fragment, last_started);
          }
          EXPECT_EQ(st.synced->theta_hash, st.synced->fragment < 0 ? sync.theta_hash()
                                                                   : sync.fragment_hash(st.synced->fragment));
        }
        if (st.started >= 0) {  // after the one finished in the same call, if any
          started[st.started]++;
          last_started = st.started;
          EXPECT_TRUE(s.in_flight());
        }
      }
      EXPECT_FALSE(s.in_flight());
      // The final sync leaves θ_local = θ everywhere.
      EXPECT_EQ(hash_floats(local.data(), n), sync.theta_hash());
      for (int f = 0; f < c.P; ++f) {
        EXPECT_EQ(sync.fragment_outer_steps()[size_t(f)], s.schedule().syncs(f, c.T)) << "fragment " << f;
        if (c.tau > 0) {
          EXPECT_EQ(started[f], s.schedule().syncs(f, c.T) - 1) << "fragment " << f;
        }
      }
      EXPECT_EQ(finished[-1], 1);  // the final sync of every fragment
      if (::testing::Test::HasFailure()) throw std::runtime_error("assertions failed in island " + std::to_string(rank));
      return log;
    });
    for (int r = 0; r < c.islands; ++r) EXPECT_EQ(out[r].find("ERROR"), std::string::npos) << run << ": " << out[r];
    for (int r = 1; r < c.islands; ++r) EXPECT_EQ(out[r], out[0]) << run << " island " << r;
  }
}

TEST_F(StreamingTest, APeerLostDuringAnOverlappedExchangeNamesTheFragmentAndLeavesThetaAlone) {
  const auto out = run_processes(2, [&](int rank) -> std::string {
    size_t n = 0;
    FragmentPlan plan = plan_for(2, 2, &n);
    Store store(store_options("lost"));
    ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = 2,
                                       .timeout = std::chrono::milliseconds(3000)});
    std::vector<float> local = test_theta0(n);
    DilocoSync sync(g, local.data(), n, {.ring = {.codec = Codec::kInt8, .chunk_bytes = 4096}}, std::move(plan));
    StreamingDiloco s(sync, g, {.inner_steps = 4, .overlap_steps = 1});
    g.barrier();  // both sides done connecting, so the loss lands in the exchange, not the rendezvous
    if (rank == 1) return "gone";  // leaves before the first exchange: its sockets close
    const std::string theta_before = sync.theta_hash();
    std::vector<float> momentum_before = sync.momentum();
    for (int64_t step = 1; step <= 8; ++step) {
      test_drift(local, rank, step);
      try {
        s.after_step(step, 8, local.data());
      } catch (const PeerLost& e) {
        EXPECT_EQ(sync.theta_hash(), theta_before);
        EXPECT_EQ(sync.momentum(), momentum_before);
        if (::testing::Test::HasFailure()) throw std::runtime_error("θ or the momentum changed");
        return std::string("PeerLost at step ") + std::to_string(step) + ": " + e.what();
      } catch (const Timeout& e) {
        EXPECT_EQ(sync.theta_hash(), theta_before);
        EXPECT_EQ(sync.momentum(), momentum_before);
        if (::testing::Test::HasFailure()) throw std::runtime_error("θ or the momentum changed");
        return std::string("Timeout at step ") + std::to_string(step) + ": " + e.what();
      }
    }
    return "no failure";
  });
  // Fragment 0's exchange starts after step 4 (in the background) and is waited for after step 5.
  EXPECT_TRUE(out[0].rfind("PeerLost", 0) == 0 || out[0].rfind("Timeout", 0) == 0) << out[0];
  EXPECT_NE(out[0].find(" at step 5: fragment 0 of 2"), std::string::npos) << out[0];
}

}  // namespace
}  // namespace atl
