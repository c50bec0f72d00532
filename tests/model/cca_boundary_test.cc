// CCA's rows over a split sequence (model/cca_boundary.h), the bookkeeping that the CPU part and
// its CUDA mirror share: the runs' layout of x and y, and the boundary messages on exact data.
// P ranks are threads over an in-process Collective (core/thread_group.h); every value names its
// sequence, position and channel, so a row that lands one place off, in the wrong sequence or
// not at all is a mismatch. tests/dist/context_parallel_test.cc checks the CPU model over real
// processes; tests/backend_cuda/device_model_context_parallel_test.cpp the device's.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "atoll/model/cca_boundary.h"
#include "atoll/model/chunk_boundary.h"
#include "atoll/model/ring_attention.h"
#include "core/thread_group.h"

namespace atl {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(CcaBoundary, WholeSequencesAreOneRunWithoutBoundaryRows) {
  const int B = 3, T = 7, lag = 3, t1 = 3;
  const CcaRuns R = cca_runs(TokenPositions{}, B, T, lag, t1);
  ASSERT_EQ(R.n, 1);
  EXPECT_EQ(R.run[0].start, 0);
  EXPECT_EQ(R.run[0].len, T);
  EXPECT_EQ(R.run[0].bnd, 0);
  EXPECT_EQ(R.x_rows, size_t(B) * T);
  EXPECT_EQ(R.y_rows, size_t(B) * (T + t1 - 1));
  int spans = 0;
  cca_for_each_span(R, B, T, [&](size_t l, size_t xr, int n) {
    ++spans;
    EXPECT_EQ(l, 0u);
    EXPECT_EQ(xr, 0u);
    EXPECT_EQ(n, B * T);
  });
  EXPECT_EQ(spans, 1);
  EXPECT_LE(R.y_rows, cca_y_rows_max(B * T, B, lag, t1));
}

// A sequence's value at global position t, channel c (positive, exact in fp32), and a delayed
// value half's (negative, so the two kinds cannot stand in for each other).
float x_code(int b, int t, int c, int T, int CC) { return float((b * T + t) * CC + c + 1); }
float v_code(int b, int t, int e, int T, int half) { return -float((b * T + t) * half + e + 1); }

// Rank r of P: its x rows (the runs' tokens coded, boundary rows NaN) and delayed halves go
// through the forward exchange, then coded boundary gradients through the backward one. Returns
// the mismatches, each described.
std::vector<std::string> check_rank(Collective& g, int T, int B, int lag, int t1, int CC, int KVD) {
  std::vector<std::string> bad;
  auto expect = [&](float got, float want, const std::string& what) {
    if (!(got == want)) bad.push_back(what + ": " + std::to_string(got) + " instead of " + std::to_string(want));
  };
  const int r = g.rank(), half = KVD / 2;
  const ZigzagLayout z{.T = T, .P = g.size()};
  const int Tr = z.local_len(r);
  const CcaRuns R = cca_runs(z.positions(r), B, Tr, lag, t1);
  const CcaBoundary p = cca_boundary(R, B, Tr, lag, CC, KVD);
  EXPECT_LE(R.x_rows, cca_x_rows_max(B * Tr, B, lag));
  EXPECT_LE(R.y_rows, cca_y_rows_max(B * Tr, B, lag, t1));
  // Token j of run i, sequence b: row x_row + b*rows + bnd + j of x, row b*Tr + local + j locally.
  std::vector<float> x(R.x_rows * CC, kNaN), vd(size_t(B) * Tr * half), v(size_t(B) * Tr * KVD, kNaN);
  for (int i = 0; i < R.n; ++i)
    for (int b = 0; b < B; ++b) {
      const CcaRun& u = R.run[i];
      for (int j = 0; j < u.len; ++j) {
        for (int c = 0; c < CC; ++c)
          x[(u.x_row + size_t(b) * u.rows() + u.bnd + j) * CC + c] = x_code(b, u.start + j, c, T, CC);
        for (int e = 0; e < half; ++e) vd[(size_t(b) * Tr + u.local + j) * half + e] = v_code(b, u.start + j, e, T, half);
      }
    }
  std::vector<float> tails(p.floats()), heads(p.floats());
  cca_pack_tails(tails.data(), x.data(), vd.data(), p);
  chunk_tails_forward(heads.data(), heads.data() + p.per_run, tails.data(), tails.data() + p.per_run, p.per_run, g);
  cca_unpack_heads(x.data(), heads.data(), p);
  cca_shift_values(v.data(), heads.data(), p);
  for (int i = 0; i < R.n; ++i)
    for (int b = 0; b < B; ++b) {
      const CcaRun& u = R.run[i];
      const std::string at = "rank " + std::to_string(r) + " run " + std::to_string(i) + " seq " + std::to_string(b);
      for (int k = 0; k < u.bnd; ++k)  // the predecessor's last lag rows, in order
        for (int c = 0; c < CC; ++c)
          expect(x[(u.x_row + size_t(b) * u.rows() + k) * CC + c], x_code(b, u.start - u.bnd + k, c, T, CC),
                 at + " boundary row " + std::to_string(k));
      for (int e = 0; e < half; ++e)  // the previous token's delayed half, or 0 at the start
        expect(v[(size_t(b) * Tr + u.local) * KVD + half + e], u.start > 0 ? v_code(b, u.start - 1, e, T, half) : 0.0f,
               at + " first value's delayed half");
    }

  // Backward: each boundary row's gradient is coded by its global position; the rows of the
  // chunks themselves start at 0.5. Each tail row must end at 0.5 + its successor's gradient of
  // the same position (0.5 where the sequence ends), each last token's dvd at the successor's
  // first token's gradient of the delayed half (0 at the end).
  std::vector<float> dx(R.x_rows * CC, 0.5f), dv(size_t(B) * Tr * KVD, kNaN), dvd(size_t(B) * Tr * half, kNaN);
  for (int i = 0; i < R.n; ++i)
    for (int b = 0; b < B; ++b) {
      const CcaRun& u = R.run[i];
      for (int k = 0; k < u.bnd; ++k)
        for (int c = 0; c < CC; ++c)
          dx[(u.x_row + size_t(b) * u.rows() + k) * CC + c] = x_code(b, u.start - u.bnd + k, c, T, CC);
      for (int e = 0; e < half && u.start > 0; ++e)
        dv[(size_t(b) * Tr + u.local) * KVD + half + e] = v_code(b, u.start - 1, e, T, half);
    }
  std::vector<float> dtails(p.floats(), kNaN), dheads(p.floats(), kNaN);
  cca_pack_dheads(dheads.data(), dx.data(), dv.data(), p);
  chunk_heads_backward(dtails.data(), dtails.data() + p.per_run, dheads.data(), dheads.data() + p.per_run, p.per_run,
                       g);
  cca_unpack_dtails(dx.data(), dvd.data(), dtails.data(), p);
  for (int i = 0; i < R.n; ++i)
    for (int b = 0; b < B; ++b) {
      const CcaRun& u = R.run[i];
      const bool last = u.start + u.len == T;  // no chunk after it
      const std::string at = "rank " + std::to_string(r) + " run " + std::to_string(i) + " seq " + std::to_string(b);
      for (int j = 0; j < u.len; ++j) {
        const int t = u.start + j;
        const bool tail = j >= u.len - lag;
        for (int c = 0; c < CC; ++c)
          expect(dx[(u.x_row + size_t(b) * u.rows() + u.bnd + j) * CC + c],
                 tail && !last ? 0.5f + x_code(b, t, c, T, CC) : 0.5f, at + " d(x) at " + std::to_string(t));
      }
      for (int e = 0; e < half; ++e)
        expect(dvd[(size_t(b) * Tr + u.local + u.len - 1) * half + e],
               last ? 0.0f : v_code(b, u.start + u.len - 1, e, T, half), at + " last token's d(delayed half)");
    }
  return bad;
}

// P 1-4 at T = 29 with a window of 3 (t0 = 2, t1 = 3): at P = 4 the shortest chunk (3 tokens) is
// the window exactly, so a tail is a whole chunk; B = 2, odd widths.
TEST(CcaBoundary, EachChunkGetsItsPredecessorsTailAndEachTailItsSuccessorsGradient) {
  const int T = 29, B = 2, t0 = 2, t1 = 3, lag = t0 - 1 + t1 - 1, CC = 5, KVD = 6;
  for (int P = 1; P <= 4; ++P) {
    SCOPED_TRACE(testing::Message() << "P=" << P);
    std::vector<std::vector<std::string>> bad(static_cast<size_t>(P));
    test::ThreadGroup::run(P, [&](Collective& g) { bad[size_t(g.rank())] = check_rank(g, T, B, lag, t1, CC, KVD); });
    for (const auto& rank : bad) {
      EXPECT_TRUE(rank.empty()) << rank.size() << " mismatches, the first: " << rank.front();
    }
  }
}

// A chunk shorter than the window would need rows of two chunks before it: refused.
TEST(CcaBoundary, ChunkShorterThanTheWindowIsRefused) {
  const ZigzagLayout z{.T = 20, .P = 4};  // chunks of 2 and 3 tokens
  const CcaRuns R = cca_runs(z.positions(1), 1, z.local_len(1), 3, 3);
  EXPECT_THROW(cca_boundary(R, 1, z.local_len(1), 3, 5, 6), CheckError);
}

}  // namespace
}  // namespace atl
