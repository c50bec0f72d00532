// Elastic outer steps with real processes: a worker killed in the middle of the ring (ATOLL_FAULT)
// makes the survivors discard the attempt, re-form without it and retry the same outer step, whose
// result is exactly the outer step on the mean of the survivors' own contributions, computed here
// independently; an exchange that succeeded but is discarded leaves the error-feedback residual
// as it was (also across a change of group); an overlapped fragment whose exchange loses a peer
// is retried at its wait point, and the survivors agree on every outer step. The run's first
// outer group (epoch 0, formed before the view exists) gives up on a stopped member within the
// heartbeat ttl, as the later epochs' groups do.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>

#include "atoll/core/fault_injection.h"
#include "atoll/dist/diloco.h"
#include "atoll/dist/elastic_group.h"
#include "atoll/dist/membership.h"
#include "atoll/dist/streaming.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using std::chrono::milliseconds;
using testing::put;
using testing::run_processes;
using testing::take;
using testing::test_value;

class ElasticTest : public testing::RedisSuite {};

// One island of an elastic run (M = 1): membership, the outer group of its view and DiLoCo over it.
struct Island {
  Store store;
  Membership membership;
  DilocoSync* sync = nullptr;  // rebound by the group when it changes
  std::unique_ptr<ElasticGroup> elastic;

  Island(const StoreOptions& so, int island, int islands)
      : store(so),
        membership(store, {.island = island, .rank = 0, .islands = islands, .workers_per_island = 1,
                           .heartbeat = milliseconds(50), .ttl = milliseconds(500), .timeout = milliseconds(15000)}) {
    membership.start_heartbeat();
    membership.announce();
    const View v = membership.initial_view();
    elastic = std::make_unique<ElasticGroup>(
        store, membership, v,
        ElasticGroupOptions{.name = "outer-r0", .connections = 2, .timeout = milliseconds(10000),
                            .on_change = [this](ProcessGroup* g) {
                              if (sync) g ? sync->rebind(*g) : sync->detach();
                            }});
  }
};

std::string floats(const std::vector<float>& x) { return std::string(reinterpret_cast<const char*>(x.data()), x.size() * 4); }
std::vector<float> floats_at(const std::string& s, size_t& at, size_t n) {
  std::vector<float> x(n);
  std::memcpy(x.data(), s.data() + at, n * 4);
  at += n * 4;
  return x;
}

TEST_F(ElasticTest, AKillDuringTheRingIsRetriedOverTheMeanOfTheSurvivors) {
  const size_t n = 3001;  // uneven: segments and chunks of different sizes
  const auto out = run_processes(3, [&](int rank) {
    ::setenv("ATOLL_FAULT", "kill:island=2:outer_step=2:ring_chunk=3", 1);
    arm_fault_injection(rank, 0);
    Island isl(store_options("kill-ring"), rank, 3);
    std::vector<float> theta0(n);
    for (size_t i = 0; i < n; ++i) theta0[i] = test_value(1, 0, i);
    // fp32: the 2-island ring mean is exactly fl(a + b) / 2, so the retry can be checked bit for bit.
    DilocoSync sync(isl.elastic->group(), theta0.data(), n,
                    {.outer_lr = 0.7, .outer_momentum = 0.9, .ring = {.codec = Codec::kFp32, .chunk_bytes = 1024}});
    isl.sync = &sync;
    StreamingDiloco streaming(sync, *isl.elastic, {.inner_steps = 1});
    std::string r;
    std::vector<float> local(theta0);
    for (int64_t step = 1; step <= 3; ++step) {
      for (size_t i = 0; i < n; ++i) local[i] -= 0.01f * test_value(uint64_t(step) + 7, rank, i);
      if (step == 2) {  // what this island brings to outer step 2: θ, m and Δ = θ − θ_local before it
        std::vector<float> delta(n);
        for (size_t i = 0; i < n; ++i) delta[i] = sync.theta()[i] - local[i];
        r += floats(sync.theta()) + floats(sync.momentum()) + floats(delta);
      }
      const StreamStep st = streaming.after_step(step, 3, local.data());
      put(r, st.synced->outer_step);
      if (step == 2) r += floats(sync.theta()) + floats(sync.momentum()) + floats(local);
      r += st.synced->theta_hash + st.synced->momentum_hash;
    }
    put(r, isl.elastic->view().epoch);
    return r;
  }, std::chrono::seconds(60), {2});
  EXPECT_EQ(out[2], "DIED");
  ASSERT_EQ(out[0].size(), out[1].size()) << out[0].substr(0, 200) << " / " << out[1].substr(0, 200);
  std::vector<float> theta[2], m[2], delta[2], theta_after[2], m_after[2], local_after[2];
  std::string hashes[2];
  for (int s = 0; s < 2; ++s) {
    size_t at = 0;
    const std::string& o = out[size_t(s)];
    EXPECT_EQ(take<int64_t>(o, at), 1);
    hashes[s] += o.substr(at, 32), at += 32;
    theta[s] = floats_at(o, at, n), m[s] = floats_at(o, at, n), delta[s] = floats_at(o, at, n);
    EXPECT_EQ(take<int64_t>(o, at), 2) << "the retried outer step keeps its number";
    theta_after[s] = floats_at(o, at, n), m_after[s] = floats_at(o, at, n), local_after[s] = floats_at(o, at, n);
    hashes[s] += o.substr(at, 32), at += 32;
    EXPECT_EQ(take<int64_t>(o, at), 3);
    hashes[s] += o.substr(at, 32), at += 32;
    EXPECT_GE(take<uint64_t>(o, at), 1u) << "the survivors moved to a later epoch";
  }
  EXPECT_EQ(hashes[0], hashes[1]) << "θ and momentum hashes equal after every outer step";
  EXPECT_EQ(theta[0], theta[1]);
  EXPECT_EQ(m[0], m[1]);
  // The outer step on the survivors' mean, computed here: the failed attempt left nothing behind.
  std::vector<float> mean(n), want_theta = theta[0], want_m = m[0];
  for (size_t i = 0; i < n; ++i) mean[i] = (delta[0][i] + delta[1][i]) / 2.0f;
  outer_nesterov_step(want_theta.data(), want_m.data(), mean.data(), n, 0.7, 0.9);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(std::memcmp(theta_after[s].data(), want_theta.data(), n * 4), 0) << "island " << s;
    EXPECT_EQ(std::memcmp(m_after[s].data(), want_m.data(), n * 4), 0) << "island " << s;
    EXPECT_EQ(std::memcmp(local_after[s].data(), want_theta.data(), n * 4), 0) << "θ_local <- θ, island " << s;
  }
}

// Error feedback: an exchange that succeeded but is discarded, then done again over another
// group (detach, rebind), gives what one exchange gives, in this step and in the next (where the
// residual it kept is used).
TEST_F(ElasticTest, ADiscardedExchangeLeavesTheResidualAsItWas) {
  const size_t n = 2000;
  const auto out = run_processes(2, [&](int rank) {
    Store store(store_options("discard"));
    ProcessGroup g0(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = 2});
    std::vector<float> theta0(n);
    for (size_t i = 0; i < n; ++i) theta0[i] = test_value(3, 0, i);
    const DilocoOptions opts{.ring = {.codec = Codec::kInt4, .chunk_bytes = 2048, .error_feedback = true}};
    DilocoSync retried(g0, theta0.data(), n, opts), once(g0, theta0.data(), n, opts);
    std::vector<float> a(n), b(n);
    auto local = [&](std::vector<float>& x, int round) {
      for (size_t i = 0; i < n; ++i) x[i] = theta0[i] - 0.3f * test_value(uint64_t(round), rank, i);
    };
    local(a, 1), local(b, 1);
    retried.snapshot(0, a.data());
    retried.exchange(0);
    retried.discard(0);
    once.snapshot(0, b.data());
    once.exchange(0);
    once.apply(0, b.data(), -1.0);
    retried.detach();
    ProcessGroup g1(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = 2, .epoch = 1});
    retried.rebind(g1);
    retried.exchange(0);  // the same Δ_f as before: the snapshot was kept
    retried.apply(0, a.data(), -1.0);
    std::string r = retried.theta_hash() + " " + once.theta_hash();
    once.rebind(g1);
    local(a, 2), local(b, 2);
    const SyncResult x = retried.sync(a.data());
    const SyncResult y = once.sync(b.data());
    std::vector<float> ra(n), rb(n);
    retried.residual(ra.data());
    once.residual(rb.data());
    return r + " | " + x.theta_hash + " " + y.theta_hash + " | residuals equal " + std::to_string(ra == rb);
  });
  for (int r = 0; r < 2; ++r) {
    const std::string& o = out[size_t(r)];
    ASSERT_EQ(o.size(), 16u + 1 + 16 + 3 + 16 + 1 + 16 + 20) << o;
    EXPECT_EQ(o.substr(0, 16), o.substr(17, 16)) << o;
    EXPECT_EQ(o.substr(36, 16), o.substr(53, 16)) << o;
    EXPECT_NE(o.find("residuals equal 1"), std::string::npos) << o;
  }
}

// Streaming with overlap: a peer killed during fragment 1's background exchange; the survivors
// retry it at the wait point and agree after every outer step, each numbered once.
TEST_F(ElasticTest, AnOverlappedExchangeThatLosesAPeerIsRetriedAtItsWaitPoint) {
  size_t n = 0;
  const std::vector<TensorSpan> spans = testing::fake_layout(4, &n);
  const int64_t H = 4, steps = 12;
  const auto out = run_processes(3, [&](int rank) {
    ::setenv("ATOLL_FAULT", "kill:island=1:outer_step=2:ring_chunk=2", 1);
    arm_fault_injection(rank, 0);
    Island isl(store_options("overlap"), rank, 3);
    std::vector<float> theta0(n);
    for (size_t i = 0; i < n; ++i) theta0[i] = test_value(5, 0, i);
    DilocoSync sync(isl.elastic->group(), theta0.data(), n, {.ring = {.codec = Codec::kInt8, .chunk_bytes = 256}},
                    plan_fragments(spans, n, 2));
    isl.sync = &sync;
    StreamingDiloco streaming(sync, *isl.elastic, {.inner_steps = H, .overlap_steps = 1, .mixing = 0.5});
    std::vector<float> local(theta0);
    std::string r;
    for (int64_t step = 1; step <= steps; ++step) {
      for (size_t i = 0; i < n; ++i) local[i] -= 0.01f * test_value(uint64_t(step), rank, i);
      const StreamStep st = streaming.after_step(step, steps, local.data());
      if (st.synced) r += std::to_string(st.synced->outer_step) + ":" + st.synced->theta_hash + " ";
    }
    return r;
  }, std::chrono::seconds(60), {1});
  EXPECT_EQ(out[1], "DIED");
  EXPECT_EQ(out[0], out[2]);
  // Fragment 0 at steps 4 and 8, fragment 1 at 6 and 10 (finished one step later), both at 12.
  int64_t expect = 1;
  size_t at = 0;
  while ((at = out[0].find(':', at)) != std::string::npos) {
    const size_t start = out[0].rfind(' ', at) == std::string::npos ? 0 : out[0].rfind(' ', at) + 1;
    const int64_t k = std::stoll(out[0].substr(start, at - start));
    EXPECT_GE(k, expect) << out[0];
    expect = k + 1;
    ++at;
  }
  EXPECT_EQ(expect, 7) << "outer steps 1..4 and the final sync of both fragments: " << out[0];
}

TEST_F(ElasticTest, TheFirstGroupGivesUpOnAStoppedMemberWithinTheTtl) {
  const auto out = run_processes(3, [&](int rank) {
    Store store(store_options("first-group"));
    Membership membership(store, {.island = rank, .rank = 0, .islands = 3, .workers_per_island = 1,
                                  .heartbeat = milliseconds(50), .ttl = milliseconds(500),
                                  .timeout = milliseconds(15000)});
    membership.start_heartbeat();
    membership.announce();
    auto elastic = ElasticGroup::start(store, membership, {.name = "outer-r0", .timeout = milliseconds(20000)});
    const std::string formed = store.run_prefix() + "/formed/", done = store.run_prefix() + "/done/";
    store.set(formed + std::to_string(rank), std::to_string(::getpid()));
    if (rank == 2) {  // stopped for real (its heartbeat too), connections open, until rank 0 lets it go
      store.wait({formed + "0", formed + "1"});
      ::raise(SIGSTOP);
      store.wait({done + "0", done + "1"});
      return std::string("let go");
    }
    store.wait({formed + "2"});
    const std::string result = testing::outcome(5, [&] { elastic->group().barrier(); });
    store.set(done + std::to_string(rank), "1");
    store.wait({done + "0", done + "1"});
    if (rank == 0) ::kill(pid_t(std::stol(*store.get(formed + "2"))), SIGCONT);
    return result;
  });
  EXPECT_EQ(out[2], "let go");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(out[size_t(r)].rfind("PeerLost: ", 0), 0u) << out[size_t(r)];
    EXPECT_NE(out[size_t(r)].find("rank 2 gone"), std::string::npos) << out[size_t(r)];
    EXPECT_EQ(out[size_t(r)].find("(after"), std::string::npos) << out[size_t(r)];
  }
}

}  // namespace
}  // namespace atl
