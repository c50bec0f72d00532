// The per-expert token-weighted outer step (diloco.expert_merge = "tokens", dist/expert_merge.h),
// with real processes over real groups and the fp32 ring: each expert's mean equals
// Σ cᵢΔᵢ / Σ cᵢ computed here independently in double, over the islands the guard kept (one
// dropped for a non-finite Δ: its counts leave the sums); an expert no kept island used keeps θ
// and its momentum; the dense parameters take the plain mean; every island ends with the same θ
// hash; equal counts give bit for bit the flat mean; and with two ranks per island (the sharded
// exchange) the counts are the island's, summed over its ranks.
#include "atoll/dist/expert_merge.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sstream>

#include "atoll/dist/diloco.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using testing::run_processes;

class ExpertMergeTest : public testing::RedisSuite {};

// θ of 41 elements: dense [0, 5), four experts of 7 elements [5, 33) (slots 0..3), dense [33, 41).
constexpr size_t kN = 41;
const std::vector<ExpertSpan> kExperts = {{5, 12, 0}, {12, 19, 1}, {19, 26, 2}, {26, 33, 3}};
constexpr size_t kSlots = 4;

std::vector<float> theta0() {
  std::vector<float> x(kN);
  for (size_t i = 0; i < kN; ++i) x[i] = float(0.5 * std::cos(double(i)));
  return x;
}

// Island m's local parameters: θ0 less a drift of a few sizes and both signs.
std::vector<float> local_of(int m) {
  std::vector<float> x = theta0();
  for (size_t i = 0; i < kN; ++i) x[i] -= float(0.01 * std::sin(double(i) * 0.7 + m) + 0.003 * (m + 1));
  return x;
}

// Δ as the snapshot takes it, in float.
std::vector<float> delta_of(int m) {
  const std::vector<float> t = theta0(), l = local_of(m);
  std::vector<float> d(kN);
  for (size_t i = 0; i < kN; ++i) d[i] = t[i] - l[i];
  return d;
}

std::string floats_text(const std::vector<float>& x) {
  std::ostringstream s;
  for (float v : x) s << std::hexfloat << v << " ";
  return s.str();
}

std::vector<double> parse(const std::string& text) {
  std::istringstream s(text);
  std::vector<double> out;
  for (std::string v; s >> v;) out.push_back(std::strtod(v.c_str(), nullptr));
  return out;
}

constexpr double kLr = 1.0, kMu = 0.5;

// One outer step of P islands: island m's counts per slot, optionally one island with a
// non-finite Δ. Returns per island "θ | m | hash".
std::vector<std::string> one_step(const StoreOptions& run, const std::vector<std::vector<double>>& counts,
                                  int nan_island, bool experts) {
  const int P = int(counts.size());
  return run_processes(P, [&](int rank) {
    Store store(run);
    ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = P});
    const std::vector<float> t0 = theta0();
    DilocoSync sync(g, t0.data(), kN,
                    {.outer_lr = kLr, .outer_momentum = kMu, .ring = {.codec = Codec::kFp32},
                     .guard = {.clip_factor = 0}, .experts = experts ? kExperts : std::vector<ExpertSpan>{},
                     .expert_slots = experts ? kSlots : 0});
    std::vector<float> local = local_of(rank);
    if (rank == nan_island) local[1] = std::nanf("");
    if (experts) {  // two inner steps' counts: the round adds them
      std::vector<double> half = counts[size_t(rank)];
      for (double& c : half) c /= 2;
      sync.add_expert_counts(half.data());
      sync.add_expert_counts(half.data());
    }
    const SyncResult r = sync.sync(local.data());
    EXPECT_EQ(hash_floats(local.data(), kN), r.theta_hash);  // θ_local <- θ
    return floats_text(sync.theta()) + "| " + floats_text(sync.momentum()) + "| " + r.theta_hash;
  });
}

// The independent reference: per element, the weighted mean over the kept islands.
void expect_weighted(const std::string& text, const std::vector<std::vector<double>>& counts, int dropped) {
  const std::vector<double> theta = parse(text.substr(0, text.find('|')));
  const std::string rest = text.substr(text.find('|') + 1);
  const std::vector<double> mom = parse(rest.substr(0, rest.find('|')));
  ASSERT_EQ(theta.size(), kN) << text;
  ASSERT_EQ(mom.size(), kN) << text;
  const std::vector<float> t0 = theta0();
  for (size_t i = 0; i < kN; ++i) {
    int slot = -1;
    for (const ExpertSpan& s : kExperts)
      if (i >= s.begin && i < s.end) slot = s.slot;
    double sum = 0, weight = 0;
    for (size_t m = 0; m < counts.size(); ++m) {
      if (int(m) == dropped) continue;
      const double w = slot < 0 ? 1.0 : counts[m][size_t(slot)];
      sum += w * double(delta_of(int(m))[i]), weight += w;
    }
    if (weight == 0) {  // an expert nobody kept used: θ and m as they were
      EXPECT_EQ(theta[i], double(t0[i])) << "element " << i << " (slot " << slot << ")";
      EXPECT_EQ(mom[i], 0.0) << "element " << i;
      continue;
    }
    const double mean = sum / weight;
    // fp32: the weights' scaling, a sum of three and the division round a few times at ~1e-2.
    EXPECT_NEAR(mom[i], mean, 1e-8) << "element " << i << " (slot " << slot << ")";
    EXPECT_NEAR(theta[i], double(t0[i]) - kLr * (mean + kMu * mean), 1e-7) << "element " << i;
  }
}

void expect_same_everywhere(const std::vector<std::string>& out) {
  for (size_t m = 1; m < out.size(); ++m) EXPECT_EQ(out[m], out[0]) << "island " << m;
  EXPECT_EQ(out[0].find("ERROR"), std::string::npos) << out[0];
}

// Slot 1: no island routed a token to it; slot 3: only island 1.
const std::vector<std::vector<double>> kCounts = {{10, 0, 6, 0}, {0, 0, 2, 8}, {4, 0, 0, 0}};

TEST_F(ExpertMergeTest, EachExpertsMeanWeighsTheIslandsByTheirTokens) {
  const auto out = one_step(store_options("experts-weighted"), kCounts, -1, true);
  expect_same_everywhere(out);
  expect_weighted(out[0], kCounts, -1);
}

TEST_F(ExpertMergeTest, ADroppedIslandsCountsLeaveTheMeanAndItsOnlyExpertKeepsTheta) {
  const auto out = one_step(store_options("experts-dropped"), kCounts, 1, true);
  expect_same_everywhere(out);
  expect_weighted(out[0], kCounts, 1);  // slot 3 had island 1 alone: now nobody kept used it
}

TEST_F(ExpertMergeTest, EqualCountsGiveExactlyTheFlatMean) {
  const std::vector<std::vector<double>> equal = {{6, 6, 6, 6}, {6, 6, 6, 6}, {6, 6, 6, 6}};
  const auto a = one_step(store_options("experts-equal"), equal, -1, true);
  const auto b = one_step(store_options("experts-off"), equal, -1, false);
  expect_same_everywhere(a);
  EXPECT_EQ(a, b);  // bit for bit (hexfloats), hashes included
}

// Momentum from an earlier round would move an expert even with a zero mean (θ − lr·μ·m): one no
// island used in this round keeps θ and m exactly, while the experts used move.
TEST_F(ExpertMergeTest, AnUnusedExpertKeepsThetaAndMomentumDespiteMomentum) {
  const auto out = run_processes(2, [&](int rank) {
    Store store(store_options("experts-momentum"));
    ProcessGroup g(store, GroupOptions{.name = "outer-r0", .rank = rank, .size = 2});
    const std::vector<float> t0 = theta0();
    DilocoSync sync(g, t0.data(), kN,
                    {.outer_lr = kLr, .outer_momentum = kMu, .ring = {.codec = Codec::kFp32},
                     .guard = {.clip_factor = 0}, .experts = kExperts, .expert_slots = kSlots});
    std::string text;
    for (const std::vector<double>& counts : {std::vector<double>{1, 1, 1, 1}, std::vector<double>{3, 0, 1, 2}}) {
      sync.add_expert_counts(counts.data());
      std::vector<float> local = sync.theta();
      for (size_t i = 0; i < kN; ++i) local[i] -= local_of(rank)[i] - t0[i] + 0.001f;  // a drift as above
      sync.sync(local.data());
      text += floats_text(sync.theta()) + "| " + floats_text(sync.momentum()) + "| ";
    }
    return text;
  });
  expect_same_everywhere(out);
  std::vector<std::vector<double>> parts;
  for (size_t at = 0, end; (end = out[0].find('|', at)) != std::string::npos; at = end + 1)
    parts.push_back(parse(out[0].substr(at, end - at)));
  ASSERT_EQ(parts.size(), 4u) << out[0];  // θ, m after round 1; θ, m after round 2
  for (size_t i = 12; i < 19; ++i) {      // slot 1: unused in round 2
    EXPECT_NE(parts[1][i], 0.0) << "round 1 left momentum on element " << i;
    EXPECT_EQ(parts[2][i], parts[0][i]) << "θ of element " << i;
    EXPECT_EQ(parts[3][i], parts[1][i]) << "m of element " << i;
  }
  for (size_t i = 5; i < 12; ++i) EXPECT_NE(parts[2][i], parts[0][i]) << "slot 0 moved, element " << i;
}

// Two islands of two ranks: each rank exchanges half of Δ over its own outer group, and the
// weights are the island's counts (its ranks' summed at the snapshot), whichever rank holds
// which expert.
TEST_F(ExpertMergeTest, ShardedIslandsWeighByTheIslandsSummedCounts) {
  // Per worker (island·2 + rank); the islands' sums are {10, 0, 6, 0} and {0, 0, 2, 8}.
  const std::vector<std::vector<double>> worker = {{7, 0, 1, 0}, {3, 0, 5, 0}, {0, 0, 2, 1}, {0, 0, 0, 7}};
  const auto out = run_processes(4, [&](int w) {
    const int island = w / 2, rank = w % 2;
    Store store(store_options("experts-sharded"));
    ProcessGroup in(store, GroupOptions{.name = "island" + std::to_string(island), .rank = rank, .size = 2});
    ProcessGroup outer(store, GroupOptions{.name = "outer-r" + std::to_string(rank), .rank = island, .size = 2});
    const std::vector<float> t0 = theta0();
    DilocoSync sync(outer, t0.data(), kN,
                    {.outer_lr = kLr, .outer_momentum = kMu, .ring = {.codec = Codec::kFp32},
                     .guard = {.clip_factor = 0}, .experts = kExperts, .expert_slots = kSlots},
                    {}, &in);
    sync.add_expert_counts(worker[size_t(w)].data());
    std::vector<float> local = local_of(island);
    const SyncResult r = sync.sync(local.data());
    return floats_text(sync.theta()) + "| " + floats_text(sync.momentum()) + "| " + r.theta_hash;
  });
  expect_same_everywhere(out);
  expect_weighted(out[0], {{10, 0, 6, 0}, {0, 0, 2, 8}}, -1);
}

// Where a fragment's experts lie in its flattened Δ and in a rank's shard of it.
TEST(ExpertSpans, FollowTheFragmentsFlatOrderAndTheShard) {
  FragmentPlan plan;
  plan.total = 40;
  plan.ranges = {{{0, 10}, {30, 40}}, {{10, 30}}};
  const std::vector<ExpertSpan> spans = {{2, 6, 0}, {12, 20, 1}, {32, 36, 2}};
  auto text = [](const std::vector<ExpertSpan>& v) {
    std::string s;
    for (const ExpertSpan& x : v) s += std::to_string(x.slot) + ":" + std::to_string(x.begin) + "-" + std::to_string(x.end) + " ";
    return s;
  };
  EXPECT_EQ(text(fragment_expert_spans(spans, plan, 0, 0, 20)), "0:2-6 2:12-16 ");
  EXPECT_EQ(text(fragment_expert_spans(spans, plan, 0, 4, 14)), "0:0-2 2:8-10 ");  // shard [4, 14), from 0
  EXPECT_EQ(text(fragment_expert_spans(spans, plan, 1, 0, 20)), "1:2-10 ");
  EXPECT_EQ(text(fragment_expert_spans(spans, plan, 1, 5, 5)), "");
}

}  // namespace
}  // namespace atl
