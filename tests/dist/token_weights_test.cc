// The token-weighted outer mean of islands on a time budget (update_guard.h step 5), with real
// processes over a real group and the fp32 ring: each member's Δ weighted by the tokens it
// trained, the mean equals Σ nᵢΔᵢ / Σ nᵢ computed here independently in double, over awkward
// sizes (1, 7, 1031 elements) and with a member dropped by the guard (its tokens leave the sum);
// equal counts give bit for bit the unweighted mean; every member learns the round's furthest
// step and its tokens in all.
#include "atoll/dist/update_guard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "atoll/dist/ring_allreduce.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using std::chrono::milliseconds;
using testing::run_processes;

class TokenWeightsTest : public testing::RedisSuite {};

// Member m's Δ: values of a few sizes and both signs, different per member.
std::vector<float> delta(int m, size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = float(0.01 * std::sin(double(i) * 0.7 + m) + 0.003 * (m + 1));
  return x;
}

struct Round {
  std::vector<int64_t> tokens;  // per member
  bool weighted = true;
  int nan_member = -1;          // this member's Δ is not finite: the guard drops it
};

// Every member's view of the round: K, the round's furthest step and tokens, its weight, and the mean.
std::vector<std::string> one_round(const StoreOptions& run, size_t n, const Round& round) {
  const int P = int(round.tokens.size());
  return run_processes(P, [&](int rank) {
    Store store(run);
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = P, .timeout = milliseconds(20000)});
    std::vector<float> x = delta(rank, n);
    if (rank == round.nan_member) x[0] = std::nanf("");
    const GuardResult r =
        guard_update(g, x.data(), x.size(), UpdateTag{.outer_step = 3, .theta_hash = "00000000000000aa"},
                     GuardOptions{.clip_factor = 0, .weight_by_tokens = round.weighted},
                     RoundWork{.step = 10 + rank, .tokens = round.tokens[size_t(rank)]});
    RingAllreduce ring(g, RingOptions{});
    ring.mean(x.data(), x.size());
    std::ostringstream s;
    s.precision(9);
    s << "K=" << r.contributors << " furthest=" << r.furthest_step << " tokens=" << r.tokens << " | mean";
    for (float v : x) s << " " << v;
    s << " | weight " << r.weight;  // last: it differs between members
    return s.str();
  });
}

std::string shared_part(const std::string& text) { return text.substr(0, text.find(" | weight")); }

double weight_of(const std::string& text) { return std::stod(text.substr(text.find(" | weight") + 9)); }

void expect_weighted_mean(const std::string& text, size_t n, const Round& round) {
  std::vector<double> want(n, 0.0);
  double total = 0;
  for (size_t m = 0; m < round.tokens.size(); ++m) {
    if (int(m) == round.nan_member) continue;
    total += double(round.tokens[m]);
    const std::vector<float> d = delta(int(m), n);
    for (size_t i = 0; i < n; ++i) want[i] += double(round.tokens[m]) * d[i];
  }
  std::istringstream s(text.substr(text.find("| mean") + 6));
  for (size_t i = 0; i < n; ++i) {
    double v = 0;
    s >> v;
    // fp32: the scaling, a sum of 3 and the division round a few times at ~1e-2 magnitudes.
    EXPECT_NEAR(v, want[i] / total, 1e-8) << "element " << i << " of " << n;
  }
}

TEST_F(TokenWeightsTest, TheMeanWeightsEachDeltaByItsTokensOverAwkwardSizes) {
  const Round round{.tokens = {100, 300, 37}};
  for (size_t n : {size_t(1), size_t(7), size_t(1031)}) {
    const auto out = one_round(store_options("weights-" + std::to_string(n)), n, round);
    for (size_t m = 1; m < out.size(); ++m) EXPECT_EQ(shared_part(out[m]), shared_part(out[0])) << "member " << m;
    EXPECT_NE(out[0].find("K=3 furthest=12 tokens=437 |"), std::string::npos) << out[0];
    expect_weighted_mean(out[0], n, round);
    EXPECT_NEAR(weight_of(out[1]), 3.0 * 300 / 437, 1e-8) << out[1];  // K·nᵢ/Σn
  }
}

TEST_F(TokenWeightsTest, ADroppedMembersTokensLeaveTheWeights) {
  const Round round{.tokens = {100, 300, 37}, .weighted = true, .nan_member = 1};
  const auto out = one_round(store_options("weights-dropped"), 7, round);
  for (size_t m = 1; m < out.size(); ++m) EXPECT_EQ(shared_part(out[m]), shared_part(out[0])) << "member " << m;
  // Its tokens were trained, so the round counts them; its Δ and weight are out of the mean.
  EXPECT_NE(out[0].find("K=2 furthest=12 tokens=437 |"), std::string::npos) << out[0];
  expect_weighted_mean(out[0], 7, round);
  EXPECT_EQ(weight_of(out[1]), 0.0);
  EXPECT_NEAR(weight_of(out[2]), 2.0 * 37 / 137, 1e-8) << out[2];
}

TEST_F(TokenWeightsTest, EqualTokensGiveExactlyTheUnweightedMean) {
  const Round equal{.tokens = {256, 256, 256}}, unweighted{.tokens = {256, 256, 256}, .weighted = false};
  const auto a = one_round(store_options("weights-equal"), 1031, equal);
  const auto b = one_round(store_options("weights-off"), 1031, unweighted);
  EXPECT_EQ(a, b);  // the means bit for bit (printed to 9 digits: every float's exact text), weights 1
  EXPECT_EQ(weight_of(a[0]), 1.0);
}

}  // namespace
}  // namespace atl
