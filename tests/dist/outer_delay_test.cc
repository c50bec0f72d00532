// The delayed outer step (dist/outer_delay.h, diloco.outer_delay = 1) with real processes: the θ
// sequence and every island's eager start equal a reference written out plainly here (each
// round's mean applied one round late, the island's own Δ as the stand-in meanwhile), to the bit;
// the delay really changes the sequence (it differs from plain DiLoCo's); and a run rebuilt from
// the state a checkpoint saves (θ, m, the outer step count, the pending Δ and the eager start)
// with its exchange started again goes on exactly as the uninterrupted one. The same with streaming
// DiLoCo's fragments (each fragment its own delayed step, several exchanges in flight at once).
#include "atoll/dist/outer_delay.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// P fragments of [0, n): an embedding, P + 1 blocks (P does not divide them) and a head, so a
// fragment holds several ranges (fragments.h); one fragment: the whole.
FragmentPlan test_plan(size_t n, int P) {
  if (P == 1) return whole_plan(n);
  const int L = P + 1;
  std::vector<TensorSpan> t = {{.name = "embed", .offset = 0, .numel = 100}};
  const size_t block = (n - 150) / size_t(L);
  for (int l = 0; l < L; ++l)
    t.push_back({.name = "block" + std::to_string(l), .offset = 100 + size_t(l) * block,
                 .numel = l + 1 < L ? block : n - 150 - size_t(l) * block, .layer = l});
  t.push_back({.name = "head", .offset = n - 50, .numel = 50});
  return plan_fragments(t, n, P);
}

class OuterDelayTest : public testing::RedisSuite {
 protected:
  static std::string reference(int rank, int N, size_t n, int64_t H, int64_t T, const std::string& run, bool delayed,
                               int P = 1);
  static std::string delayed_run(int rank, int N, size_t n, int64_t H, int64_t T, const std::string& run,
                                 int64_t break_at, int P = 1);
};

// "step:θ-hash:local-hash " after every outer step of the reference, written from the formulas:
// at the end of fragment f's round r, θ_f and m_f take the outer step of its round r−1's mean;
// Δ_f = start_f − local_f; its next round starts from θ_f − lr·(Δ_f + μ·(μ·m_f + Δ_f)) (m_f
// unchanged); the last step applies every pending mean, exchanges every fragment's Δ_f at once
// and ends on θ. `delayed` false: plain DiLoCo, for contrast (one fragment).
std::string OuterDelayTest::reference(int rank, int N, size_t n, int64_t H, int64_t T, const std::string& run,
                                      bool delayed, int P) {
  Store store(store_options(run));
  ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = N});
  RingAllreduce ring(g, RingOptions{.codec = Codec::kInt8, .chunk_bytes = 4096});
  const FragmentPlan plan = test_plan(n, P);
  const FragmentSchedule schedule(H, P);
  std::vector<float> theta = test_theta0(n), m(n, 0.0f), local = theta, start = theta;
  std::vector<std::vector<float>> pending_mean(static_cast<size_t>(P));
  // Fragment f's ranges of x, flattened, and back.
  const auto gather = [&](int f, const std::vector<float>& x) {
    std::vector<float> out;
    for (const ElementRange& r : plan.ranges[size_t(f)])
      out.insert(out.end(), x.begin() + long(r.begin), x.begin() + long(r.end));
    return out;
  };
  const auto scatter = [&](int f, const std::vector<float>& flat, std::vector<float>& x) {
    size_t k = 0;
    for (const ElementRange& r : plan.ranges[size_t(f)])
      for (size_t i = r.begin; i < r.end; ++i) x[i] = flat[k++];
  };
  const auto step_of = [&](int f, const std::vector<float>& mean) {  // the outer step on θ_f, m_f
    std::vector<float> t = gather(f, theta), mm = gather(f, m);
    outer_nesterov_step(t.data(), mm.data(), mean.data(), t.size(), kLr, kMu);
    scatter(f, t, theta), scatter(f, mm, m);
  };
  std::string log;
  for (int64_t step = 1; step <= T; ++step) {
    test_drift(local, rank, step);
    const int due = step == T ? -1 : schedule.due(step, T);
    if (due < 0 && step != T) continue;
    for (int f = 0; f < P; ++f) {
      if (step != T && f != due) continue;
      if (!pending_mean[size_t(f)].empty()) step_of(f, pending_mean[size_t(f)]);
    }
    for (int f = 0; f < P; ++f) {
      if (step != T && f != due) continue;
      const std::vector<float> s = gather(f, start), l = gather(f, local);
      std::vector<float> delta(s.size());
      for (size_t i = 0; i < s.size(); ++i) delta[i] = s[i] - l[i];
      std::vector<float> mean = delta;
      ring.mean(mean.data(), mean.size());
      pending_mean[size_t(f)].clear();
      if (!delayed || step == T) {
        step_of(f, mean);
        scatter(f, gather(f, theta), start), scatter(f, gather(f, theta), local);
        continue;
      }
      pending_mean[size_t(f)] = mean;
      std::vector<float> t = gather(f, theta), mm = gather(f, m), e(s.size());
      for (size_t i = 0; i < e.size(); ++i) {
        const float x = std::fma(float(kMu), mm[i], delta[i]);
        e[i] = std::fma(float(-kLr), std::fma(float(kMu), x, delta[i]), t[i]);
      }
      scatter(f, e, start), scatter(f, e, local);
    }
    log += std::to_string(step) + ":" + hash_floats(theta.data(), n) + ":" + hash_floats(local.data(), n) + " ";
  }
  return log;
}

// The same through DilocoSync and StreamingDiloco with a delay; `break_at` > 0: after that
// step (a sync step) the state a checkpoint holds is copied, everything is rebuilt from it on a
// new group, and the exchanges in flight start again.
std::string OuterDelayTest::delayed_run(int rank, int N, size_t n, int64_t H, int64_t T, const std::string& run,
                                        int64_t break_at, int P) {
  const DilocoOptions opts{.outer_lr = kLr, .outer_momentum = kMu, .ring = {.codec = Codec::kInt8, .chunk_bytes = 4096}};
  std::string log;
  std::vector<float> local = test_theta0(n);
  int64_t step = 1;
  const auto note = [&](const StreamingDiloco& s, const DilocoSync& sync, const StreamStep& st) {
    if (step != T && s.schedule().due(step, T) < 0) return;
    if (st.synced) {
      const int f = st.synced->fragment;
      EXPECT_EQ(st.synced->theta_hash, step == T || P == 1 ? sync.theta_hash() : sync.fragment_hash(f));
    }
    log += std::to_string(step) + ":" + sync.theta_hash() + ":" + hash_floats(local.data(), n) + " ";
  };
  {
    Store store(store_options(run));
    ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = N});
    OuterDelay delay(test_plan(n, P));
    DilocoSync sync(g, local.data(), n, opts, test_plan(n, P));
    StreamingDiloco s(sync, g, {.inner_steps = H, .delay = &delay});
    for (; step <= T; ++step) {
      test_drift(local, rank, step);
      const StreamStep st = s.after_step(step, T, local.data());
      // A fragment's first round has nothing to apply, and its latest is in flight; the last
      // step applies every round (syncs(): the regular ones before it and the final one).
      int64_t applied = 0;
      for (int f = 0; f < P; ++f)
        applied += step == T ? s.schedule().syncs(f, T) : std::max<int64_t>(0, s.schedule().syncs(f, step + 1) - 2);
      if (st.synced) {
        EXPECT_EQ(st.synced->outer_step, applied) << "step " << step;
      }
      note(s, sync, st);
      const int due = s.schedule().due(step, T);
      if (due >= 0 && step < T) {
        EXPECT_TRUE(s.in_flight() && delay.pending(due) && s.checkpoint_safe()) << "step " << step;
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
    // What a checkpoint saves, into a new worker on a new group; the old exchanges finish
    // unused (the old objects wait for them when they go).
    const std::vector<float> theta = sync.theta(), m = sync.momentum(), start = delay.start();
    const float* saved = delay.layout_delta(sync);
    const std::vector<float> d(saved, saved + n);
    const std::vector<int64_t> outer = sync.fragment_outer_steps();
    const std::vector<bool> pending = delay.pending_list();
    Store store2(store_options(run + "-resumed"));
    ProcessGroup g2(store2, GroupOptions{.name = "outer-r0", .rank = rank, .size = N});
    OuterDelay delay2(test_plan(n, P));
    DilocoSync sync2(g2, theta.data(), n, opts, test_plan(n, P));
    sync2.momentum() = m;
    std::copy(d.begin(), d.end(), delay2.layout_delta(sync2));
    sync2.set_fragment_outer_steps(outer);
    delay2.start() = start;
    delay2.set_pending_list(pending);
    StreamingDiloco s2(sync2, g2, {.inner_steps = H, .delay = &delay2});
    s2.resume_in_flight(step);
    EXPECT_TRUE(s2.checkpoint_safe());
    for (++step; step <= T; ++step) {
      test_drift(local, rank, step);
      note(s2, sync2, s2.after_step(step, T, local.data()));
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

// Fragments: each its own delayed step, staggered, with P exchanges in flight (H = 7 and a run of
// 26 steps, not a multiple of it): θ and every island's eager starts equal the written-out
// reference to the bit, θ agrees across islands, and a run rebuilt from checkpoint state with
// every fragment's exchange in flight goes on bit for bit.
TEST_F(OuterDelayTest, FragmentsEachTakeTheirOwnDelayedStepBitForBit) {
  const int N = 2;
  const int64_t H = 7, T = 26;
  for (const int P : {2, 3}) {
    SCOPED_TRACE("fragments " + std::to_string(P));
    const std::string run = "delay-frag" + std::to_string(P);
    // Steps 14 and 17 (P = 2), 16 and 18 (P = 3): the newest exchange just started, the others in flight.
    const int64_t break_at = P == 2 ? 17 : 18;
    const auto out = run_processes(N, [&](int rank) {
      const size_t n = 1000 + 37;
      const std::string ref = reference(rank, N, n, H, T, run + "-ref", true, P);
      const std::string got = delayed_run(rank, N, n, H, T, run + "-got", 0, P);
      const std::string resumed = delayed_run(rank, N, n, H, T, run + "-cut", break_at, P);
      EXPECT_EQ(got, ref);
      EXPECT_EQ(resumed, ref);
      EXPECT_NE(ref, reference(rank, N, n, H, T, run + "-one", true, 1));  // the fragments change the sequence
      if (::testing::Test::HasFailure())
        throw std::runtime_error("assertions failed in island " + std::to_string(rank));
      return got;
    });
    const auto thetas = [](const std::string& log) {
      std::string t;
      for (size_t at = 0; (at = log.find(':', at)) != std::string::npos; at = log.find(' ', at))
        t += log.substr(at + 1, 16) + " ";
      return t;
    };
    EXPECT_EQ(thetas(out[1]), thetas(out[0]));
    EXPECT_NE(out[1], out[0]);  // the eager starts are each island's own
  }
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
