// backend/cpu/linear.h (fp32 through oneDNN's sgemm, fp64 through OpenBLAS) against the
// reference layer layers/linear.h (the BLAS library itself), over awkward sizes: 1, odd, not a
// multiple of the vector width, larger than a block; forward (=) and backward (+=).
#include "atoll/backend/cpu/linear.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/layers/linear.h"
#include "backend/fast_vs_reference.h"

namespace atl {
namespace {

using test::max_rel;
using test::normal;

template <typename T>
void compare(int N, int IC, int OC, double tol) {
  Rng rng(uint64_t(N * 1000003 + IC * 1009 + OC));
  const auto in = normal<T>(rng, size_t(N) * IC), w = normal<T>(rng, size_t(OC) * IC);
  const auto dout = normal<T>(rng, size_t(N) * OC), din0 = normal<T>(rng, size_t(N) * IC);
  const auto dw0 = normal<T>(rng, size_t(OC) * IC);
  std::vector<T> out(size_t(N) * OC, T(NAN)), ref(out.size(), T(NAN));
  cpu::linear_forward(out.data(), in.data(), w.data(), N, IC, OC);
  linear_forward(ref.data(), in.data(), w.data(), N, IC, OC);
  EXPECT_LE(max_rel(out, ref), tol) << "forward N " << N << " IC " << IC << " OC " << OC;
  auto din = din0, dw = dw0, rdin = din0, rdw = dw0;  // (+=) onto prefilled buffers
  cpu::linear_backward(din.data(), dw.data(), dout.data(), in.data(), w.data(), N, IC, OC);
  linear_backward(rdin.data(), rdw.data(), dout.data(), in.data(), w.data(), N, IC, OC);
  EXPECT_LE(max_rel(din, rdin), tol) << "din N " << N << " IC " << IC << " OC " << OC;
  EXPECT_LE(max_rel(dw, rdw), tol) << "dw N " << N << " IC " << IC << " OC " << OC;
}

const int kSizes[][3] = {{1, 1, 1}, {1, 7, 3}, {5, 17, 33}, {31, 64, 15}, {130, 257, 65}, {257, 96, 300}};

TEST(CpuLinear, Fp32MatchesReferenceLayer) {
  for (const auto& s : kSizes) compare<float>(s[0], s[1], s[2], 1e-5);  // ~2^-24 per add, sums of ≤ 300 terms
}

TEST(CpuLinear, Fp64MatchesReferenceLayer) {
  for (const auto& s : kSizes) compare<double>(s[0], s[1], s[2], 1e-13);
}

}  // namespace
}  // namespace atl
