// The delayed outer step (dist/outer_delay.h, diloco.outer_delay = 1) with real processes: the θ
// sequence and every island's eager start equal a reference written out plainly here (each
// round's mean applied one round late, the island's own Δ as the stand-in meanwhile), to the bit;
// the delay really changes the sequence (it differs from plain DiLoCo's); and a run rebuilt from
// the state a checkpoint saves (θ, m, the outer step count, the pending Δ and the eager start)
// with its exchange started again goes on exactly as the uninterrupted one.
#include "atoll/dist/outer_delay.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "atoll/dist/streaming.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using testing::run_processes;
using testing::test_drift;
using testing::test_theta0;
using testing::test_value;

constexpr double kLr = 0.7, kMu = 0.9;

class OuterDelayTest : public testing::RedisSuite {
 protected:
  static std::string reference(int rank, int N, size_t n, int64_t H, int64_t T, const std::string& run, bool delayed);
  static std::string delayed_run(int rank, int N, size_t n, int64_t H, int64_t T, const std::string& run,
                                 int64_t break_at);
};

// "step:θ-hash:local-hash " after every outer step of the reference, written from the formulas:
// at the end of round r, θ and m take the outer step of round r−1's mean; Δ = start − local;
// the next round starts from θ − lr·(Δ + μ·(μ·m + Δ)) (m unchanged); the last step exchanges
// its Δ at once and ends on θ. `delayed` false: plain DiLoCo, for contrast.
std::string OuterDelayTest::reference(int rank, int N, size_t n, int64_t H, int64_t T, const std::string& run,
                                      bool delayed) {
  Store store(store_options(run));
  ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = N});
  RingAllreduce ring(g, RingOptions{.codec = Codec::kInt8, .chunk_bytes = 4096});
  std::vector<float> theta = test_theta0(n), m(n, 0.0f), local = theta, start = theta, delta(n), pending_mean;
  std::string log;
  for (int64_t step = 1; step <= T; ++step) {
    test_drift(local, rank, step);
    if (step % H != 0 && step != T) continue;
    if (!pending_mean.empty()) outer_nesterov_step(theta.data(), m.data(), pending_mean.data(), n, kLr, kMu);
    for (size_t i = 0; i < n; ++i) delta[i] = start[i] - local[i];
    std::vector<float> mean = delta;
    ring.mean(mean.data(), n);
    if (!delayed || step == T) {
      outer_nesterov_step(theta.data(), m.data(), mean.data(), n, kLr, kMu);
      pending_mean.clear();
      start = local = theta;
    } else {
      pending_mean = mean;
      for (size_t i = 0; i < n; ++i) {
        const float mm = std::fma(float(kMu), m[i], delta[i]);
        start[i] = std::fma(float(-kLr), std::fma(float(kMu), mm, delta[i]), theta[i]);
      }
      local = start;
    }
    log += std::to_string(step) + ":" + hash_floats(theta.data(), n) + ":" + hash_floats(local.data(), n) + " ";
  }
  return log;
}

// The same through DilocoSync and StreamingDiloco with a delay; `break_at` > 0: after that
// step (a sync step) the state a checkpoint holds is copied, everything is rebuilt from it on a
// new group, and the exchange in flight starts again.
std::string OuterDelayTest::delayed_run(int rank, int N, size_t n, int64_t H, int64_t T, const std::string& run,
                                        int64_t break_at) {
  const DilocoOptions opts{.outer_lr = kLr, .outer_momentum = kMu, .ring = {.codec = Codec::kInt8, .chunk_bytes = 4096}};
  std::string log;
  std::vector<float> local = test_theta0(n);
  int64_t step = 1;
  {
    Store store(store_options(run));
    ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = N});
    OuterDelay delay(n);
    DilocoSync sync(g, local.data(), n, opts);
    StreamingDiloco s(sync, g, {.inner_steps = H, .delay = &delay});
    for (; step <= T; ++step) {
      test_drift(local, rank, step);
      const StreamStep st = s.after_step(step, T, local.data());
      if (st.synced) {
        EXPECT_EQ(st.synced->outer_step, step == T ? T / H + (T % H != 0) : step / H - 1) << "step " << step;
        log += std::to_string(step) + ":" + st.synced->theta_hash + ":" + hash_floats(local.data(), n) + " ";
      } else if (step % H == 0) {  // the first round: nothing to apply yet, the eager start taken
        log += std::to_string(step) + ":" + sync.theta_hash() + ":" + hash_floats(local.data(), n) + " ";
      }
      if (step % H == 0 && step < T) {
        EXPECT_TRUE(s.in_flight() && delay.pending() && s.checkpoint_safe()) << "step " << step;
      } else {
        EXPECT_FALSE(s.checkpoint_safe() && s.in_flight()) << "step " << step;
      }
      if (step == break_at) break;
    }
    if (step > T) {
      EXPECT_FALSE(s.in_flight());
      EXPECT_FALSE(delay.pending());
      EXPECT_EQ(hash_floats(local.data(), n), sync.theta_hash());  // the run ends on θ everywhere
      return log;
    }
    // What a checkpoint saves, into a new worker on a new group; the old exchange finishes
    // unused (the old objects wait for it when they go).
    const std::vector<float> theta = sync.theta(), m = sync.momentum(), d = sync.delta(0), start = delay.start();
    const std::vector<int64_t> outer = sync.fragment_outer_steps();
    const bool pending = delay.pending();
    Store store2(store_options(run + "-resumed"));
    ProcessGroup g2(store2, GroupOptions{.name = "outer-r0", .rank = rank, .size = N});
    OuterDelay delay2(n);
    DilocoSync sync2(g2, theta.data(), n, opts);
    sync2.momentum() = m;
    sync2.delta(0) = d;
    sync2.set_fragment_outer_steps(outer);
    delay2.start() = start;
    delay2.set_pending(pending);
    StreamingDiloco s2(sync2, g2, {.inner_steps = H, .delay = &delay2});
    s2.resume_in_flight(step);
    for (++step; step <= T; ++step) {
      test_drift(local, rank, step);
      const StreamStep st = s2.after_step(step, T, local.data());
      if (st.synced) log += std::to_string(step) + ":" + st.synced->theta_hash + ":" + hash_floats(local.data(), n) + " ";
    }
  }
  return log;
}

TEST_F(OuterDelayTest, ThetaAndEagerStartsEqualTheWrittenOutReferenceToTheBit) {
  struct Case {
    int islands;
    int64_t H, T;
  };
  for (const Case c : {Case{2, 3, 11}, Case{3, 4, 12}}) {
    const std::string run = "delay-" + std::to_string(c.islands) + "-" + std::to_string(c.H);
    const auto out = run_processes(c.islands, [&](int rank) {
      const size_t n = 1000 + 37;  // not a multiple of a chunk or of the codec's 256-element scales
      const std::string ref = reference(rank, c.islands, n, c.H, c.T, run + "-ref", true);
      const std::string plain = reference(rank, c.islands, n, c.H, c.T, run + "-plain", false);
      const std::string got = delayed_run(rank, c.islands, n, c.H, c.T, run + "-got", 0);
      EXPECT_EQ(got, ref);
      EXPECT_NE(ref, plain);  // the delay changes the sequence: the test can tell them apart
      if (::testing::Test::HasFailure()) throw std::runtime_error("assertions failed in island " + std::to_string(rank));
      return got;
    });
    for (int r = 0; r < c.islands; ++r) EXPECT_EQ(out[r].find("ERROR"), std::string::npos) << run << ": " << out[r];
  }
}

// θ is shared: every island logs the same θ hash after each outer step, while the eager starts
// (each island's own Δ) differ.
TEST_F(OuterDelayTest, ThetaAgreesAcrossIslandsWhileTheStartsDiffer) {
  const int N = 3;
  const auto out = run_processes(N, [&](int rank) {
    const std::string log = delayed_run(rank, N, 513, 2, 9, "delay-agree", 0);
    std::string thetas;
    for (size_t at = 0; (at = log.find(':', at)) != std::string::npos; at = log.find(' ', at))
      thetas += log.substr(at + 1, 16) + " ";
    return thetas + "|" + log;
  });
  const auto thetas = [](const std::string& s) { return s.substr(0, s.find('|')); };
  for (int r = 1; r < N; ++r) {
    EXPECT_EQ(thetas(out[size_t(r)]), thetas(out[0])) << out[size_t(r)];
    EXPECT_NE(out[size_t(r)], out[0]);  // the local parameters (eager starts) are the island's own
  }
}

TEST_F(OuterDelayTest, ARunRebuiltFromCheckpointStateWithItsExchangeInFlightGoesOnBitForBit) {
  const int N = 2;
  const int64_t H = 3, T = 13;
  const auto out = run_processes(N, [&](int rank) {
    const std::string whole = delayed_run(rank, N, 777, H, T, "delay-whole", 0);
    const std::string resumed = delayed_run(rank, N, 777, H, T, "delay-broken", 6);  // steps 3 and 6 exchanged
    EXPECT_EQ(resumed, whole);
    if (::testing::Test::HasFailure()) throw std::runtime_error("assertions failed in island " + std::to_string(rank));
    return resumed;
  });
  for (int r = 0; r < N; ++r) EXPECT_EQ(out[size_t(r)].find("ERROR"), std::string::npos) << out[size_t(r)];
}

TEST(EagerStart, IsTheNesterovStepOfDeltaOnACopy) {
  // Against outer_nesterov_step on copies of θ and m: the same bits, θ and m untouched.
  const size_t n = 19;
  std::vector<float> theta(n), m(n), d(n), start(n);
  for (size_t i = 0; i < n; ++i) theta[i] = test_value(2, 0, i), m[i] = test_value(3, 0, i), d[i] = test_value(4, 0, i);
  const std::vector<float> theta_was = theta, m_was = m;
  eager_start(start.data(), theta.data(), m.data(), d.data(), n, kLr, kMu);
  std::vector<float> t2 = theta, m2 = m;
  outer_nesterov_step(t2.data(), m2.data(), d.data(), n, kLr, kMu);
  EXPECT_EQ(hash_floats(start.data(), n), hash_floats(t2.data(), n));
  EXPECT_EQ(theta, theta_was);
  EXPECT_EQ(m, m_was);
}

}  // namespace
}  // namespace atl
