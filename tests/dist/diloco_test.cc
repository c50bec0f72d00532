// The DiLoCo outer step: the Nesterov arithmetic against a hand computation; with real
// processes (2 and 3 islands) every island ends every outer step with bit-identical θ for every
// codec (int8 with error feedback included), θ follows the fp64 outer step on the fp64 mean
// within the ring's error bound, and lr 1 / μ 0 is plain parameter averaging; sharded over an
// island's ranks, θ is unchanged and each rank sends an M-th.
#include "atoll/dist/diloco.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>

#include "atoll/supervise/redis_server.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using std::chrono::milliseconds;
using testing::run_processes;
using testing::test_value;

class DilocoTest : public testing::RedisSuite {};

// Numbers chosen so every intermediate is exact in fp32: the result must match exactly.
TEST(OuterNesterov, MatchesAHandComputation) {
  float theta[3] = {1.0f, -2.0f, 0.5f}, m[3] = {0.5f, 0.0f, -1.0f};
  const float d[3] = {0.25f, 1.0f, -0.5f};
  outer_nesterov_step(theta, m, d, 3, /*lr=*/0.5, /*mu=*/0.5);
  // m = 0.5 m + d = {0.5, 1, -1};  u = 0.5 m + d = {0.5, 1.5, -1};  θ -= 0.5 u
  EXPECT_EQ(m[0], 0.5f);
  EXPECT_EQ(m[1], 1.0f);
  EXPECT_EQ(m[2], -1.0f);
  EXPECT_EQ(theta[0], 0.75f);
  EXPECT_EQ(theta[1], -2.75f);
  EXPECT_EQ(theta[2], 1.0f);
  // A second step carries the momentum: m = {0.25+0.25, 0.5+1, -0.5-0.5} = {0.5, 1.5, -1}.
  outer_nesterov_step(theta, m, d, 3, 0.5, 0.5);
  EXPECT_EQ(m[1], 1.5f);
  EXPECT_EQ(theta[1], -2.75f - 0.5f * (1.0f + 0.75f));
}

// Island r's local parameters after some inner steps: θ0 plus a rank-dependent drift.
std::vector<float> local_after(const std::vector<float>& theta, int rank, int round) {
  std::vector<float> x(theta);
  for (size_t i = 0; i < x.size(); ++i) x[i] -= 0.01f * test_value(uint64_t(round) + 7, rank, i);
  return x;
}

TEST_F(DilocoTest, EveryIslandHoldsBitIdenticalThetaAfterEveryOuterStep) {
  const size_t n = 3001;  // uneven: not a multiple of the ranks or of a codec block
  struct Case {
    int islands;
    Codec codec;
    bool ef;
  };
  for (const Case c : {Case{2, Codec::kInt8, false}, Case{3, Codec::kInt8, true}, Case{3, Codec::kInt4, false},
                       Case{3, Codec::kBf16, false}, Case{2, Codec::kFp32, false}}) {
    const std::string run = std::string("theta-") + codec_name(c.codec) + std::to_string(c.islands) + (c.ef ? "ef" : "");
    const auto out = run_processes(c.islands, [&](int rank) {
      Store store(store_options(run));
      ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = c.islands, .connections = 2});
      std::vector<float> theta0(n);
      for (size_t i = 0; i < n; ++i) theta0[i] = test_value(1, 0, i);
      DilocoSync sync(g, theta0.data(), n, {.ring = {.codec = c.codec, .chunk_bytes = 4096, .error_feedback = c.ef}});
      std::string hashes;
      for (int round = 0; round < 3; ++round) {
        std::vector<float> local = local_after(sync.theta(), rank, round);
        const SyncResult r = sync.sync(local.data());
        EXPECT_EQ(r.outer_step, round + 1);
        EXPECT_EQ(hash_floats(local.data(), n), r.theta_hash);  // θ_local <- θ
        hashes += r.theta_hash + " ";
      }
      return hashes;
    });
    for (int r = 1; r < c.islands; ++r) EXPECT_EQ(out[r], out[0]) << run << " island " << r;
    EXPECT_EQ(out[0].find("ERROR"), std::string::npos) << out[0];
  }
}

// fp32, lr 1, μ 0: θ becomes the mean of the islands' θ_local (to fp32 rounding of the mean),
// and with lr 0.7, μ 0.9 θ follows the fp64 computation within the int8 ring's bound.
TEST_F(DilocoTest, OuterStepFollowsTheFp64Reference) {
  const size_t n = 1000;
  const int P = 3;
  struct Case {
    double lr, mu;
    Codec codec;
  };
  for (const Case c : {Case{1.0, 0.0, Codec::kFp32}, Case{0.7, 0.9, Codec::kInt8}}) {
    const std::string run = "ref-" + std::string(codec_name(c.codec));
    const auto out = run_processes(P, [&](int rank) {
      Store store(store_options(run));
      ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = P});
      std::vector<float> theta0(n);
      for (size_t i = 0; i < n; ++i) theta0[i] = test_value(1, 0, i);
      DilocoSync sync(g, theta0.data(), n,
                      {.outer_lr = c.lr, .outer_momentum = c.mu, .ring = {.codec = c.codec}});
      for (int round = 0; round < 2; ++round) {
        std::vector<float> local = local_after(sync.theta(), rank, round);
        sync.sync(local.data());
      }
      return std::string(reinterpret_cast<const char*>(sync.theta().data()), n * sizeof(float));
    });
    ASSERT_EQ(out[0].size(), n * sizeof(float)) << out[0];
    const float* got = reinterpret_cast<const float*>(out[0].data());
    // The fp64 reference of the same two rounds (local drift as in local_after).
    std::vector<double> theta(n), m(n, 0.0);
    for (size_t i = 0; i < n; ++i) theta[i] = test_value(1, 0, i);
    for (int round = 0; round < 2; ++round)
      for (size_t i = 0; i < n; ++i) {
        double d = 0;
        for (int r = 0; r < P; ++r) d += 0.01 * double(float(test_value(uint64_t(round) + 7, r, i))) / P;
        m[i] = c.mu * m[i] + d;
        theta[i] -= c.lr * (d + c.mu * m[i]);
      }
    // Tolerance: fp32 rounding of θ (|θ| <= 1e3: a few ulps, 1e-6 relative) plus, for int8, the
    // ring's bound on Δ̄ (|Δ| <= 0.01·1e3 per block) times the outer step's gain
    // lr·(1 + μ + μ²)·2 rounds.
    for (size_t i = 0; i < n; ++i) {
      const double ring = ring_error_bound(c.codec, P, 0.01 * 1e3) * c.lr * (1 + c.mu + c.mu * c.mu) * 2;
      EXPECT_NEAR(got[i], theta[i], 4e-6 * (1 + std::fabs(theta[i])) + ring) << i;
    }
  }
}

// Sharded over the ranks of an island (N islands x M ranks, real processes): rank s exchanges
// only its M-th of each fragment over outer-r<s>, then the island shares the shards. With fp32
// and 2 islands every mean is one exact commutative sum, so θ and θ_local must equal the
// unsharded run's bit for bit, on every rank, through the Nesterov momentum and 2 fragments of
// uneven ranges; and each rank's outer bytes are ~1/M of the unsharded rank's. int8 with error
// feedback over 3 islands x 2 ranks: every process ends on the same θ.
TEST_F(DilocoTest, ShardingOverAnIslandsRanksGivesTheSameThetaForAnMthOfTheBytes) {
  size_t n = 0;
  const std::vector<TensorSpan> spans = testing::fake_layout(4, &n);
  struct Case {
    int islands, ranks;
    Codec codec;
    bool ef;
  };
  std::map<std::string, std::pair<std::string, uint64_t>> fp32;  // by M: θ hashes, bytes per rank
  for (const Case c : {Case{2, 1, Codec::kFp32, false}, Case{2, 2, Codec::kFp32, false},
                       Case{2, 3, Codec::kFp32, false}, Case{3, 2, Codec::kInt8, true}}) {
    const std::string run = "shard-" + std::string(codec_name(c.codec)) + std::to_string(c.islands) + "x" +
                            std::to_string(c.ranks);
    const auto out = run_processes(c.islands * c.ranks, [&](int p) {
      const int island = p / c.ranks, rank = p % c.ranks;
      Store store(store_options(run));
      ProcessGroup in(store, GroupOptions{.name = "island" + std::to_string(island), .rank = rank, .size = c.ranks});
      ProcessGroup g(store, GroupOptions{.name = "outer-r" + std::to_string(rank), .rank = island, .size = c.islands});
      std::vector<float> theta0(n);
      for (size_t i = 0; i < n; ++i) theta0[i] = test_value(1, 0, i);
      DilocoSync sync(g, theta0.data(), n,
                      {.outer_lr = 0.7, .outer_momentum = 0.9,
                       .ring = {.codec = c.codec, .chunk_bytes = 1024, .error_feedback = c.ef}},
                      plan_fragments(spans, n, 2), &in);
      std::string hashes;
      uint64_t bytes = 0;
      for (int round = 0; round < 3; ++round) {
        std::vector<float> local = local_after(sync.theta(), island, round);
        const SyncResult r = sync.sync(local.data());
        hashes += r.theta_hash + "/" + hash_floats(local.data(), n) + "/" + hash_floats(sync.momentum().data(), n) + " ";
        bytes += r.bytes_sent;
      }
      return hashes + "bytes " + std::to_string(bytes);
    });
    for (int p = 0; p < c.islands * c.ranks; ++p) {
      ASSERT_EQ(out[p].find("ERROR"), std::string::npos) << run << ": " << out[p];
      EXPECT_EQ(out[p].substr(0, out[p].find("bytes")), out[0].substr(0, out[0].find("bytes"))) << run << " process " << p;
    }
    if (c.codec == Codec::kFp32)
      fp32[std::to_string(c.ranks)] = {out[0].substr(0, out[0].find("bytes")),
                                       std::stoull(out[0].substr(out[0].find("bytes") + 6))};
  }
  const auto& [unsharded, bytes1] = fp32.at("1");
  for (const std::string m : {"2", "3"}) {
    EXPECT_EQ(fp32.at(m).first, unsharded) << "M = " << m;
    const double ratio = double(fp32.at(m).second) * std::stod(m) / double(bytes1);
    EXPECT_NEAR(ratio, 1.0, 0.05) << "M = " << m << ": " << fp32.at(m).second << " bytes per rank against " << bytes1;
  }
}

}  // namespace
}  // namespace atl
