// Bad updates from a peer, with real processes over a real group: four members, one of which
// sends a NaN, a 10^6-times-scaled, a sign-flipped or a stale Δ. The non-finite and the stale one
// are dropped and the ring's mean is the mean over the other three; the scaled one is clipped to
// clip_factor x the lower median norm; the flipped one is dropped by its direction (a sketch's
// cosine with the median's), and passes with that check off (its norm is honest). Every member
// reaches the same verdict and the same bit-identical mean.
#include "atoll/dist/update_guard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "atoll/dist/ring_allreduce.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using std::chrono::milliseconds;
using testing::run_processes;

class UpdateGuardTest : public testing::RedisSuite {};

constexpr int kMembers = 4;
constexpr size_t kN = 7;

// Member m's honest Δ: norms within a few percent of one another.
std::vector<float> honest(int m) {
  std::vector<float> x(kN);
  for (size_t i = 0; i < kN; ++i) x[i] = float(0.01 * (double(i) - 3.0) + 0.001 * m);
  return x;
}

double norm(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += double(v) * v;
  return std::sqrt(s);
}

// Every member's verdict (incidents) and the ring's mean, as text (equal on every member).
std::string round_text(const StoreOptions& run, int rank, const std::vector<float>& x0, const UpdateTag& tag,
                       double min_cosine) {
  Store store(run);
  ProcessGroup g(store, GroupOptions{.rank = rank, .size = kMembers, .timeout = milliseconds(20000)});
  std::vector<float> x = x0;
  const GuardResult r = guard_update(g, x.data(), x.size(), tag, GuardOptions{.clip_factor = 2.0, .min_cosine = min_cosine});
  RingAllreduce ring(g, RingOptions{});
  ring.mean(x.data(), x.size());
  std::ostringstream s;
  s.precision(9);
  s << "K=" << r.contributors;
  for (const UpdateIncident& i : r.incidents)
    s << " | " << i.kind << " member " << i.member << " " << i.why << " norm " << i.norm << " median " << i.median
      << " scale " << i.scale;
  s << " | mean";
  for (float v : x) s << " " << v;
  return s.str();
}

std::vector<std::string> one_round(const StoreOptions& run, int bad,
                                   const std::function<void(std::vector<float>&, UpdateTag&)>& spoil,
                                   double min_cosine = -1.0) {
  return run_processes(kMembers, [&](int rank) {
    std::vector<float> x = honest(rank);
    UpdateTag tag{.outer_step = 5, .theta_hash = "00000000000000aa"};
    if (rank == bad) spoil(x, tag);
    return round_text(run, rank, x, tag, min_cosine);
  });
}

void expect_same_everywhere(const std::vector<std::string>& out) {
  for (int r = 1; r < kMembers; ++r) EXPECT_EQ(out[size_t(r)], out[0]) << "member " << r;
}

// The fp32 mean over `members` of their honest Δs, as the ring computes it to within rounding.
std::vector<double> mean_of(const std::vector<int>& members) {
  std::vector<double> m(kN, 0.0);
  for (int k : members)
    for (size_t i = 0; i < kN; ++i) m[i] += honest(k)[i] / double(members.size());
  return m;
}

void expect_mean(const std::string& text, const std::vector<double>& want) {
  std::istringstream s(text.substr(text.find("| mean") + 6));
  for (size_t i = 0; i < kN; ++i) {
    double v = 0;
    s >> v;
    EXPECT_NEAR(v, want[i], 1e-6) << "element " << i << " of " << text;  // fp32 rounding of a few ops
  }
}

TEST_F(UpdateGuardTest, HonestMembersAreLeftAlone) {
  const auto out = one_round(store_options("guard-honest"), -1, [](std::vector<float>&, UpdateTag&) {});
  expect_same_everywhere(out);
  EXPECT_EQ(out[0].find("update"), std::string::npos) << out[0];
  EXPECT_NE(out[0].find("K=4"), std::string::npos) << out[0];
  expect_mean(out[0], mean_of({0, 1, 2, 3}));
}

TEST_F(UpdateGuardTest, ANonFiniteDeltaIsDroppedAndTheMeanIsOverTheOthers) {
  const auto out = one_round(store_options("guard-nan"), 3, [](std::vector<float>& x, UpdateTag&) { x[2] = std::nanf(""); });
  expect_same_everywhere(out);
  EXPECT_NE(out[0].find("K=3 | dropped_update member 3 not finite"), std::string::npos) << out[0];
  expect_mean(out[0], mean_of({0, 1, 2}));
}

TEST_F(UpdateGuardTest, AStaleDeltaIsDroppedByItsTag) {
  // A replayed Δ carries the tag of the round it was computed for.
  const auto out = one_round(store_options("guard-stale"), 1, [](std::vector<float>& x, UpdateTag& tag) {
    for (float& v : x) v *= 1.01f;
    tag = UpdateTag{.outer_step = 4, .theta_hash = "00000000000000bb"};
  });
  expect_same_everywhere(out);
  EXPECT_NE(out[0].find("K=3 | dropped_update member 1 stale: computed from outer step 4 (θ 00000000000000bb) where "
                        "the round is outer step 5 (θ 00000000000000aa)"),
            std::string::npos)
      << out[0];
  expect_mean(out[0], mean_of({0, 2, 3}));
}

TEST_F(UpdateGuardTest, AHugeDeltaIsClippedToTwiceTheMedianNorm) {
  const auto out = one_round(store_options("guard-scale"), 2, [](std::vector<float>& x, UpdateTag&) {
    for (float& v : x) v *= 1e6f;
  });
  expect_same_everywhere(out);
  EXPECT_NE(out[0].find("K=4 | clipped_update member 2"), std::string::npos) << out[0];
  // Norms of members 0, 1, 3 and 10^6 x member 2's: the lower median is member 1's.
  std::vector<double> norms = {norm(honest(0)), norm(honest(1)), norm(honest(2)) * 1e6, norm(honest(3))};
  std::sort(norms.begin(), norms.end());
  const double limit = 2.0 * norms[1];
  std::vector<double> want = mean_of({0, 1, 3});
  for (size_t i = 0; i < kN; ++i) want[i] = (want[i] * 3 + honest(2)[i] / norm(honest(2)) * limit) / 4;
  EXPECT_LT(std::abs(want[0]), 1.0) << "the clipped mean is of the honest size";
  std::istringstream s(out[0].substr(out[0].find("| mean") + 6));
  for (size_t i = 0; i < kN; ++i) {
    double v = 0;
    s >> v;
    EXPECT_NEAR(v, want[i], 1e-5 * std::max(1.0, std::abs(want[i]))) << i << ": " << out[0];
  }
}

TEST_F(UpdateGuardTest, ASignFlippedDeltaIsDroppedByItsDirection) {
  const auto out = one_round(
      store_options("guard-opposed"), 0, [](std::vector<float>& x, UpdateTag&) { for (float& v : x) v = -v; }, 0.0);
  expect_same_everywhere(out);
  EXPECT_NE(out[0].find("K=3 | dropped_update member 0 opposed: cosine -"), std::string::npos) << out[0];
  expect_mean(out[0], mean_of({1, 2, 3}));
}

TEST_F(UpdateGuardTest, ASignFlippedDeltaKeepsItsNormAndPassesWithoutTheDirectionCheck) {
  const auto out = one_round(store_options("guard-flip"), 0, [](std::vector<float>& x, UpdateTag&) {
    for (float& v : x) v = -v;
  });
  expect_same_everywhere(out);
  EXPECT_EQ(out[0].find("update"), std::string::npos) << out[0];
  EXPECT_NE(out[0].find("K=4"), std::string::npos) << out[0];
}

}  // namespace
}  // namespace atl
