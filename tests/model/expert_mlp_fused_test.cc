// The fused dispatch-experts-combine (backend/cpu/expert_mlp.h) against the layers it fuses:
// dispatch_forward, expert_mlp_forward, combine_forward and their backward passes, in double,
// with a chunk capacity small enough that experts split into several chunks, and one expert
// left without rows; and with skipped slots (kNoExpert, the zaya router's skip class).
// (It sits under tests/model because it needs the layers as its reference, which the backend
// tests do not link.)
#include "atoll/backend/cpu/expert_mlp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/layers/expert_mlp.h"
#include "atoll/layers/moe_dispatch.h"

namespace atl {
namespace {

std::vector<double> randn(size_t n, Rng& rng) {
  std::vector<double> x(n);
  for (auto& v : x) v = rng.normal();
  return x;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// `skips`: the first slot of every third token is kNoExpert.
void compare(int N, int C, int H, int E, int K, int chunk_rows, bool skips = false) {
  Rng rng(uint64_t(N * 131 + chunk_rows));
  std::vector<int32_t> topk(size_t(N) * K);
  for (int n = 0; n < N; ++n)  // K distinct experts per token, never the last one (left empty)
    for (int j = 0; j < K; ++j) topk[size_t(n) * K + j] = skips && j == 0 && n % 3 == 0 ? kNoExpert : (n + j) % (E - 1);
  ExpertRouting r;
  build_routing(r, topk.data(), N, E, K);
  const size_t R = size_t(N) * K, WH = size_t(E) * H * C;
  auto x = randn(size_t(N) * C, rng), dout = randn(size_t(N) * C, rng), w = randn(size_t(N) * K, rng);
  auto w1 = randn(WH, rng), w3 = randn(WH, rng), w2 = randn(WH, rng);

  // Reference: the separate layers.
  std::vector<double> xe(R * C), ye(R * C), a1(R * H), b1(R * H), g(R * H), out1(size_t(N) * C);
  dispatch_forward(xe.data(), x.data(), r, N, C, K);
  expert_mlp_forward(ye.data(), a1.data(), b1.data(), g.data(), xe.data(), w1.data(), w3.data(), w2.data(),
                     r.offsets.data(), E, C, H);
  combine_forward(out1.data(), ye.data(), w.data(), r, N, C, K);
  std::vector<double> dye(R * C), dtopk1(size_t(N) * K), dxe(R * C), da(R * H), db(R * H), dx1(size_t(N) * C, 0.5);
  std::vector<double> dw1_1(WH, 0.25), dw3_1(WH, 0.25), dw2_1(WH, 0.25);  // (+=) outputs start non-zero
  combine_backward(dye.data(), dtopk1.data(), dout.data(), ye.data(), w.data(), r, N, C, K);
  expert_mlp_backward(dxe.data(), dw1_1.data(), dw3_1.data(), dw2_1.data(), g.data(), da.data(), db.data(), dye.data(),
                      a1.data(), b1.data(), xe.data(), w1.data(), w3.data(), w2.data(), r.offsets.data(), E, C, H);
  dispatch_backward(dx1.data(), dxe.data(), r, N, C, K);

  // Fused.
  std::vector<double> wrow(R), dwrow(R), a2(R * H), b2(R * H), out2(size_t(N) * C, 9.0), dx2(size_t(N) * C, 0.5);
  std::vector<double> dw1_2(WH, 0.25), dw3_2(WH, 0.25), dw2_2(WH, 0.25);
  for (size_t i = 0; i < R; ++i)
    if (r.slot_row[i] >= 0) wrow[r.slot_row[i]] = w[i];
  std::vector<double> scratch(ExpertChunk<double>::elements(chunk_rows, C, H));
  const auto s = ExpertChunk<double>::carve(scratch.data(), chunk_rows, C, H);
  expert_mlp_forward_fused(out2.data(), a2.data(), b2.data(), s, x.data(), r.row_token.data(), wrow.data(), w1.data(),
                           w3.data(), w2.data(), r.offsets.data(), N, E, C, H);
  expert_mlp_backward_fused(dx2.data(), dw1_2.data(), dw3_2.data(), dw2_2.data(), dwrow.data(), s, dout.data(),
                            x.data(), r.row_token.data(), wrow.data(), a2.data(), b2.data(), w1.data(), w3.data(),
                            w2.data(), r.offsets.data(), E, C, H);
  std::vector<double> dtopk2(size_t(N) * K);
  for (size_t i = 0; i < R; ++i) dtopk2[i] = r.slot_row[i] >= 0 ? dwrow[r.slot_row[i]] : 0;

  // Double sums of a few dozen O(1)-to-O(100) terms in another order: 1e-10 absolute.
  const double tol = 1e-10;
  EXPECT_LT(max_abs_diff(out1, out2), tol) << "out N=" << N << " chunk=" << chunk_rows;
  EXPECT_LT(max_abs_diff(a1, a2), tol) << "a";
  EXPECT_LT(max_abs_diff(b1, b2), tol) << "b";
  EXPECT_LT(max_abs_diff(dx1, dx2), tol) << "dx";
  EXPECT_LT(max_abs_diff(dtopk1, dtopk2), tol) << "dtopk_w";
  EXPECT_LT(max_abs_diff(dw1_1, dw1_2), tol) << "dw1";
  EXPECT_LT(max_abs_diff(dw3_1, dw3_2), tol) << "dw3";
  EXPECT_LT(max_abs_diff(dw2_1, dw2_2), tol) << "dw2";
}

TEST(ExpertMlpFused, MatchesSeparateLayers) {
  for (int chunk : {1, 2, 3, 64}) compare(7, 5, 6, 4, 2, chunk);
  compare(1, 3, 2, 3, 1, 1);
  compare(33, 8, 12, 5, 2, 7);
}

TEST(ExpertMlpFused, MatchesSeparateLayersWithSkippedSlots) {
  for (int chunk : {1, 3, 64}) compare(7, 5, 6, 4, 2, chunk, true);
  compare(10, 4, 3, 3, 1, 2, true);
}

}  // namespace
}  // namespace atl
