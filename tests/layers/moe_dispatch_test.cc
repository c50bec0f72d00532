// MoE dispatch and combine: the routing (a counting sort of (token, slot) pairs by expert),
// the gather into expert order, and the weighted scatter back.
#include "atoll/layers/moe_dispatch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "atoll/core/check.h"
#include "grad_check.h"

namespace atl {
namespace {

using test::check_grad;
using test::randn;

// Random top-k choices: K distinct experts per token, as the router produces.
std::vector<int32_t> random_topk(Rng& rng, int N, int E, int K) {
  std::vector<int32_t> idx(size_t(N) * K);
  std::vector<int32_t> perm(E);
  for (int n = 0; n < N; ++n) {
    for (int e = 0; e < E; ++e) perm[e] = e;
    for (int j = 0; j < K; ++j) {
      std::swap(perm[j], perm[j + rng.below(uint64_t(E - j))]);
      idx[size_t(n) * K + j] = perm[j];
    }
  }
  return idx;
}

// Every property the experts and the combine rely on.
void expect_valid_routing(const ExpertRouting& r, const std::vector<int32_t>& topk_idx, int N, int E, int K) {
  const size_t R = size_t(N) * K;
  ASSERT_EQ(r.offsets.size(), size_t(E + 1));
  ASSERT_EQ(r.row_token.size(), R);
  ASSERT_EQ(r.slot_row.size(), R);
  EXPECT_EQ(r.offsets[0], 0);
  EXPECT_EQ(size_t(r.offsets[E]), R);
  for (int e = 0; e < E; ++e) {
    int count = 0;
    for (int32_t x : topk_idx) count += x == e;
    EXPECT_EQ(r.offsets[e + 1] - r.offsets[e], count) << "expert " << e;
  }
  // slot_row is a bijection from (n, j) onto rows: every pair exactly once.
  std::vector<int> hits(R, 0);
  for (size_t i = 0; i < R; ++i) {
    const int32_t row = r.slot_row[i];
    ASSERT_TRUE(row >= 0 && size_t(row) < R);
    ++hits[row];
    EXPECT_EQ(r.row_token[row], int32_t(i / K)) << "row " << row << " belongs to token " << i / K;
    EXPECT_GE(row, r.offsets[topk_idx[i]]) << "row outside its expert's block";
    EXPECT_LT(row, r.offsets[topk_idx[i] + 1]) << "row outside its expert's block";
  }
  for (size_t row = 0; row < R; ++row) EXPECT_EQ(hits[row], 1) << "row " << row;
  // Tokens strictly ascending within an expert (distinct experts per token).
  for (int e = 0; e < E; ++e)
    for (int row = r.offsets[e] + 1; row < r.offsets[e + 1]; ++row) EXPECT_LT(r.row_token[row - 1], r.row_token[row]);
}

TEST(BuildRouting, HandWorkedExample) {
  // N=4, K=2, E=4. Expert 3 gets nothing; expert 1 gets every token.
  const std::vector<int32_t> topk = {1, 0,  //
                                     2, 1,  //
                                     1, 2,  //
                                     0, 1};
  ExpertRouting r;
  build_routing(r, topk.data(), 4, 4, 2);
  EXPECT_EQ(r.offsets, (std::vector<int32_t>{0, 2, 6, 8, 8}));
  EXPECT_EQ(r.row_token, (std::vector<int32_t>{0, 3, 0, 1, 2, 3, 1, 2}));
  EXPECT_EQ(r.slot_row, (std::vector<int32_t>{2, 0, 6, 3, 4, 7, 1, 5}));
  expect_valid_routing(r, topk, 4, 4, 2);
}

TEST(BuildRouting, CoversEverySlotOnceOnRandomChoices) {
  for (auto [N, E, K] : {std::tuple{1, 1, 1}, {13, 8, 2}, {33, 5, 5}, {7, 16, 3}}) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " E=" << E << " K=" << K);
    Rng rng(1);
    const auto topk = random_topk(rng, N, E, K);
    ExpertRouting r;
    build_routing(r, topk.data(), N, E, K);
    expect_valid_routing(r, topk, N, E, K);
  }
}

TEST(BuildRouting, ReusedStructIsRebuiltAndEmptyBatchWorks) {
  Rng rng(2);
  ExpertRouting r;
  const auto big = random_topk(rng, 20, 6, 2);
  build_routing(r, big.data(), 20, 6, 2);
  const auto small = random_topk(rng, 3, 4, 2);
  build_routing(r, small.data(), 3, 4, 2);
  expect_valid_routing(r, small, 3, 4, 2);
  build_routing(r, nullptr, 0, 4, 2);
  EXPECT_EQ(r.offsets, (std::vector<int32_t>{0, 0, 0, 0, 0}));
  EXPECT_TRUE(r.row_token.empty());
}

TEST(BuildRouting, RejectsExpertIdsOutOfRange) {
  ExpertRouting r;
  const std::vector<int32_t> hi = {0, 4}, lo = {-2, 0};
  EXPECT_THROW(build_routing(r, hi.data(), 1, 4, 2), CheckError);
  EXPECT_THROW(build_routing(r, lo.data(), 1, 4, 2), CheckError);
}

// The zaya router's skip class: a slot of kNoExpert gets no row (no expert computes it), adds 0
// to its token, passes no gradient back and has a weight gradient of 0.
TEST(BuildRouting, SkippedSlotsGetNoRowAndAddNothing) {
  // N=4, K=1, E=3: tokens 1 and 3 skip.
  const std::vector<int32_t> topk = {2, kNoExpert, 0, kNoExpert};
  ExpertRouting r;
  build_routing(r, topk.data(), 4, 3, 1);
  EXPECT_EQ(r.offsets, (std::vector<int32_t>{0, 1, 1, 2}));
  EXPECT_EQ(r.row_token, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(r.slot_row, (std::vector<int32_t>{1, -1, 0, -1}));
  const int C = 2;
  const std::vector<double> x = {1, 2, 3, 4, 5, 6, 7, 8}, w = {0.5, 0.25, 2, 0.75};
  std::vector<double> xe(2 * C);
  dispatch_forward(xe.data(), x.data(), r, 4, C, 1);
  EXPECT_EQ(xe, (std::vector<double>{5, 6, 1, 2}));
  const std::vector<double> ye = {10, 20, 30, 40};  // expert 0's row (token 2), expert 2's (token 0)
  std::vector<double> out(4 * C, -1);
  combine_forward(out.data(), ye.data(), w.data(), r, 4, C, 1);
  EXPECT_EQ(out, (std::vector<double>{15, 20, 0, 0, 20, 40, 0, 0}));
  const std::vector<double> dout = {1, 1, 1, 1, 1, 1, 1, 1};
  std::vector<double> dye(2 * C, -1), dw(4, -1), dx(4 * C, 0);
  combine_backward(dye.data(), dw.data(), dout.data(), ye.data(), w.data(), r, 4, C, 1);
  EXPECT_EQ(dw, (std::vector<double>{70, 0, 30, 0}));
  EXPECT_EQ(dye, (std::vector<double>{2, 2, 0.5, 0.5}));
  dispatch_backward(dx.data(), dye.data(), r, 4, C, 1);
  EXPECT_EQ(dx, (std::vector<double>{0.5, 0.5, 0, 0, 2, 2, 0, 0}));
  // Every slot skipped: no rows at all.
  const std::vector<int32_t> none = {kNoExpert, kNoExpert};
  build_routing(r, none.data(), 2, 3, 1);
  EXPECT_EQ(r.offsets, (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_TRUE(r.row_token.empty());
}

TEST(Dispatch, ForwardCopiesTokenRowsAndCombineWeights) {
  const int N = 5, E = 4, K = 2, C = 3;
  Rng rng(3);
  const auto topk = random_topk(rng, N, E, K);
  ExpertRouting r;
  build_routing(r, topk.data(), N, E, K);
  const auto x = randn(rng, N * C), ye = randn(rng, N * K * C), w = randn(rng, N * K);
  std::vector<double> xe(N * K * C, std::numeric_limits<double>::quiet_NaN());
  dispatch_forward(xe.data(), x.data(), r, N, C, K);
  for (int row = 0; row < N * K; ++row)
    for (int c = 0; c < C; ++c) EXPECT_EQ(xe[row * C + c], x[r.row_token[row] * C + c]);
  std::vector<double> out(N * C, std::numeric_limits<double>::quiet_NaN());
  combine_forward(out.data(), ye.data(), w.data(), r, N, C, K);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      double s = 0.0;
      for (int j = 0; j < K; ++j) s += w[n * K + j] * ye[r.slot_row[n * K + j] * C + c];
      EXPECT_NEAR(out[n * C + c], s, 1e-15);
    }
}

struct Routing {
  int N = 6, E = 4, K = 2, C = 5;
  ExpertRouting r;
  std::vector<int32_t> topk;
};

Routing make_routing(uint64_t seed) {
  Routing s;
  Rng rng(seed);
  s.topk = random_topk(rng, s.N, s.E, s.K);
  build_routing(s.r, s.topk.data(), s.N, s.E, s.K);
  return s;
}

TEST(DispatchGrad, MatchesFiniteDifferences) {
  const Routing s = make_routing(4);
  Rng rng(5);
  const auto x = randn(rng, s.N * s.C), dxe = randn(rng, s.N * s.K * s.C);
  std::vector<double> dx(x.size(), 0.0);
  dispatch_backward(dx.data(), dxe.data(), s.r, s.N, s.C, s.K);
  auto loss = [&](const std::vector<double>& v) {
    std::vector<double> xe(s.N * s.K * s.C);
    dispatch_forward(xe.data(), v.data(), s.r, s.N, s.C, s.K);
    return test::dot(xe, dxe);
  };
  EXPECT_TRUE(check_grad("dx", loss, x, dx));
}

// dx is (+=): the residual stream's gradient arrives already holding the skip connection.
// Integer values keep the sums exact.
TEST(DispatchGrad, AccumulatesIntoPrefilledBuffer) {
  const Routing s = make_routing(6);
  Rng rng(7);
  const auto dxe = test::randint(rng, s.N * s.K * s.C, 9);
  std::vector<double> g(s.N * s.C, 0.0);
  dispatch_backward(g.data(), dxe.data(), s.r, s.N, s.C, s.K);
  const auto prefill = test::randint(rng, g.size(), 100);
  auto dx = prefill;
  dispatch_backward(dx.data(), dxe.data(), s.r, s.N, s.C, s.K);
  dispatch_backward(dx.data(), dxe.data(), s.r, s.N, s.C, s.K);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_EQ(dx[i], prefill[i] + 2 * g[i]) << i;
}

TEST(CombineGrad, MatchesFiniteDifferences) {
  const Routing s = make_routing(8);
  Rng rng(9);
  const auto ye = randn(rng, s.N * s.K * s.C), w = randn(rng, s.N * s.K), dout = randn(rng, s.N * s.C);
  const double nan = std::numeric_limits<double>::quiet_NaN();  // both outputs are (=)
  std::vector<double> dye(ye.size(), nan), dw(w.size(), nan);
  combine_backward(dye.data(), dw.data(), dout.data(), ye.data(), w.data(), s.r, s.N, s.C, s.K);
  auto forward = [&](const std::vector<double>& y, const std::vector<double>& ww) {
    std::vector<double> out(s.N * s.C);
    combine_forward(out.data(), y.data(), ww.data(), s.r, s.N, s.C, s.K);
    return test::dot(out, dout);
  };
  EXPECT_TRUE(check_grad(
      "dye", [&](const std::vector<double>& y) { return forward(y, w); }, ye, dye));
  EXPECT_TRUE(check_grad(
      "dtopk_w", [&](const std::vector<double>& ww) { return forward(ye, ww); }, w, dw));
}

TEST(Dispatch, FloatMatchesDouble) {
  const int N = 37, E = 7, K = 3, C = 33;
  Rng rng(10);
  const auto topk = random_topk(rng, N, E, K);
  ExpertRouting r;
  build_routing(r, topk.data(), N, E, K);
  const auto x = randn(rng, N * C), ye = randn(rng, N * K * C), w = randn(rng, N * K), dout = randn(rng, N * C);
  const auto xf = test::to_float(x), yef = test::to_float(ye), wf = test::to_float(w), df = test::to_float(dout);
  std::vector<double> xe(N * K * C), out(N * C), dye(N * K * C), dw(N * K), dx(N * C, 0.0);
  std::vector<float> xef(N * K * C), outf(N * C), dyef(N * K * C), dwf(N * K), dxf(N * C, 0.0f);
  dispatch_forward(xe.data(), x.data(), r, N, C, K);
  dispatch_forward(xef.data(), xf.data(), r, N, C, K);
  EXPECT_TRUE(test::float_close("xe", xef, xe, 1e-7));  // a copy: only the rounding to float
  combine_forward(out.data(), ye.data(), w.data(), r, N, C, K);
  combine_forward(outf.data(), yef.data(), wf.data(), r, N, C, K);
  EXPECT_TRUE(test::float_close("combine", outf, out));
  combine_backward(dye.data(), dw.data(), dout.data(), ye.data(), w.data(), r, N, C, K);
  combine_backward(dyef.data(), dwf.data(), df.data(), yef.data(), wf.data(), r, N, C, K);
  EXPECT_TRUE(test::float_close("dye", dyef, dye));
  EXPECT_TRUE(test::float_close("dtopk_w", dwf, dw));
  dispatch_backward(dx.data(), dye.data(), r, N, C, K);
  dispatch_backward(dxf.data(), dyef.data(), r, N, C, K);
  EXPECT_TRUE(test::float_close("dx", dxf, dx));
}

}  // namespace
}  // namespace atl
