// Streaming DiLoCo's fragment plan and schedule (dist/fragments.h): every tensor in exactly one
// fragment, layers strided, the fragments partitioning the flat buffer (padding included); the
// staggered schedule against hand-listed steps; the user-facing checks naming their keys.
#include "atoll/dist/fragments.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "atoll/core/errors.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using testing::fake_layout;

TEST(FragmentPlan, EveryTensorInExactlyOneFragmentWithLayersStrided) {
  for (int layers : {1, 2, 3, 5, 7}) {
    for (int P = 1; P <= layers; ++P) {
      size_t total = 0;
      const auto tensors = fake_layout(layers, &total);
      const FragmentPlan plan = plan_fragments(tensors, total, P);
      ASSERT_EQ(plan.count(), P);
      // Every element of [0, total) in exactly one fragment's ranges.
      std::vector<int> owner(total, -1);
      size_t covered = 0;
      for (int f = 0; f < P; ++f) {
        size_t prev_end = 0;
        for (const ElementRange& r : plan.ranges[size_t(f)]) {
          EXPECT_LT(r.begin, r.end);
          EXPECT_TRUE(prev_end == 0 || r.begin > prev_end) << "ranges ascending and merged";
          prev_end = r.end;
          for (size_t i = r.begin; i < r.end; ++i) {
            EXPECT_EQ(owner[i], -1) << "element " << i << " in two fragments";
            owner[i] = f;
          }
        }
        covered += plan.size(f);
      }
      EXPECT_EQ(covered, total) << layers << " layers, P " << P;
      // Every tensor named once; whole tensors: all of a tensor's elements in its fragment.
      std::map<std::string, int> named;
      for (int f = 0; f < P; ++f)
        for (const auto& name : plan.tensors[size_t(f)]) EXPECT_TRUE(named.emplace(name, f).second) << name;
      ASSERT_EQ(named.size(), tensors.size());
      for (const TensorSpan& t : tensors) {
        const int f = named.at(t.name);
        for (size_t i = t.offset; i < t.offset + t.numel; ++i) ASSERT_EQ(owner[i], f) << t.name;
        if (t.layer >= 0) {
          EXPECT_EQ(f, t.layer % P) << t.name;
        }
      }
      EXPECT_EQ(named.at("embed"), 0);
      EXPECT_EQ(named.at("final_norm"), P - 1);
      EXPECT_EQ(named.at("head"), P - 1);
    }
  }
}

TEST(FragmentPlan, OneFragmentIsTheWholeBuffer) {
  size_t total = 0;
  const auto tensors = fake_layout(3, &total);
  const FragmentPlan plan = plan_fragments(tensors, total, 1);
  ASSERT_EQ(plan.ranges[0].size(), 1u);
  EXPECT_EQ(plan.ranges[0][0].begin, 0u);
  EXPECT_EQ(plan.ranges[0][0].end, total);
  const FragmentPlan whole = whole_plan(1234);
  ASSERT_EQ(whole.count(), 1);
  EXPECT_EQ(whole.size(0), 1234u);
}

TEST(FragmentSchedule, StaggeredEveryHStepsAndTheLastStepIsTheFinalSync) {
  // H = 6, P = 3: offsets 0, 2, 4; fragment f syncs at offset_f + 6k (k >= 1) below the last step.
  const FragmentSchedule s(6, 3);
  EXPECT_EQ(s.offset(0), 0);
  EXPECT_EQ(s.offset(1), 2);
  EXPECT_EQ(s.offset(2), 4);
  std::map<int, std::vector<int64_t>> due;
  for (int64_t t = 0; t <= 20; ++t)
    if (const int f = s.due(t, 20); f >= 0) due[f].push_back(t);
  EXPECT_EQ(due[0], (std::vector<int64_t>{6, 12, 18}));
  EXPECT_EQ(due[1], (std::vector<int64_t>{8, 14}));  // not 2 (t > offset), not 20 (the last step)
  EXPECT_EQ(due[2], (std::vector<int64_t>{10, 16}));
  EXPECT_EQ(s.syncs(0, 20), 4);  // plus the final sync
  EXPECT_EQ(s.syncs(1, 20), 3);
  EXPECT_EQ(s.syncs(2, 20), 3);
  // H = 5, P = 2 (P does not divide H): offsets 0 and 2.
  const FragmentSchedule u(5, 2);
  EXPECT_EQ(u.offset(1), 2);
  EXPECT_EQ(u.due(7, 20), 1);
  EXPECT_EQ(u.due(5, 20), 0);
  // P = 1 is plain DiLoCo: every H steps (the last step being the final sync).
  const FragmentSchedule one(4, 1);
  for (int64_t t = 1; t < 10; ++t) EXPECT_EQ(one.due(t, 10), t % 4 == 0 ? 0 : -1) << t;
  EXPECT_EQ(one.due(10, 10), -1);
  EXPECT_EQ(one.syncs(0, 10), 3);  // 4, 8, 10
  EXPECT_EQ(one.syncs(0, 8), 2);   // 4, 8
}

TEST(FragmentSchedule, BadValuesAreConfigErrorsNamingTheKeys) {
  auto error_of = [](DilocoConfig d, int layers) -> std::string {
    try {
      validate_streaming(d, layers);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  DilocoConfig d;
  d.inner_steps = 12;
  d.fragments = 5;
  std::string e = error_of(d, 4);
  EXPECT_NE(e.find("diloco.fragments"), std::string::npos) << e;
  EXPECT_NE(e.find("model.n_layers"), std::string::npos) << e;
  EXPECT_NE(e.find("fix"), std::string::npos) << e;
  d.fragments = 3;
  d.overlap_steps = 4;  // 4 * 3 = 12, not below H
  e = error_of(d, 4);
  EXPECT_NE(e.find("diloco.overlap_steps"), std::string::npos) << e;
  EXPECT_NE(e.find("at most 3"), std::string::npos) << e;
  d.overlap_steps = 3;
  EXPECT_EQ(error_of(d, 4), "");
  d.fragments = 1;
  d.overlap_steps = 12;  // P = 1: τ < H
  EXPECT_NE(error_of(d, 4).find("diloco.overlap_steps"), std::string::npos);
  d.overlap_steps = 11;
  EXPECT_EQ(error_of(d, 4), "");
  d.inner_steps = 2;
  d.fragments = 3;
  d.overlap_steps = 0;
  e = error_of(d, 4);
  EXPECT_NE(e.find("diloco.inner_steps"), std::string::npos) << e;
}

}  // namespace
}  // namespace atl
