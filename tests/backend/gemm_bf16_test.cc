// bf16 matrix products (oneDNN) against gemm_reference in double: all four transposes,
// alpha/beta, padded leading dimensions, awkward sizes; the conversions bit for bit.
#include "atoll/backend/cpu/gemm_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "atoll/backend/cpu/gemm.h"
#include "atoll/core/rng.h"

namespace atl {
namespace {

constexpr double kU32 = std::numeric_limits<float>::epsilon() / 2;  // fp32 unit roundoff, 2^-24

// Rounding to nearest even on values chosen at the boundaries: exact results.
TEST(Bf16, ConversionRoundsToNearestEven) {
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(bits(0x3f808000)), 0x3f80);  // tie, even below: stays
  EXPECT_EQ(float_to_bf16(bits(0x3f818000)), 0x3f82);  // tie, odd below: rounds up to even
  EXPECT_EQ(float_to_bf16(bits(0x3f808001)), 0x3f81);  // above the tie: up
  EXPECT_EQ(float_to_bf16(bits(0x3f807fff)), 0x3f80);  // below the tie: down
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
}

// The vector and parallel paths give the scalar rounding on every element, at lengths that
// exercise the tails (not multiples of the 16/32-lane vectors) and the threaded split.
TEST(Bf16, BulkConversionMatchesScalar) {
  Rng rng(7);
  for (size_t n : {size_t(0), size_t(1), size_t(31), size_t(33), size_t(1000), size_t(1) << 17 | 5, size_t(66049)}) {
    std::vector<float> x(n), back(n);
    for (auto& v : x) v = float(rng.normal() * 100);
    std::vector<bf16> h(n);
    to_bf16(h.data(), x.data(), n);
    from_bf16(back.data(), h.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(h[i], float_to_bf16(x[i])) << "n=" << n << " i=" << i;
      ASSERT_EQ(back[i], bf16_to_float(h[i]));
      ASSERT_LE(std::abs(back[i] - x[i]), kBf16Unit * std::abs(x[i]));
    }
  }
}

struct Case {
  bool ta, tb;
  int M, N, K;
  float alpha, beta;
  int pad;
};

// One product three ways: gemm_bf16_f32 (fp32 inputs rounded inside, packed), gemm_bf16 on
// inputs already in bf16 (padded leading dimensions, so oneDNN may sum in another order) and
// the double reference on the fp32 inputs. Error bound, per entry: each
// input is rounded once to bf16 (relative error ≤ u = 2^-8), so each product a·b is off by
// at most (2u + u²)|a||b|; accumulating K terms in fp32 adds γ_K ≈ K·2^-24 of Σ|a||b|, and the
// alpha scale, beta·c and the final rounding a few 2^-24 more (Higham §3.1). So
//   |C − ref| ≤ |alpha|(2u + u² + (K+3)·2^-24) Σ|a||b| + 3·2^-24 |beta c|.
// This is the worst case: typical errors are ~2^-8·sqrt(K) smaller relative to Σ|a||b|.
::testing::AssertionResult run_case(const Case& c, Rng& rng) {
  const int a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> A(size_t(a_rows) * lda + 1, nan), B(size_t(b_rows) * ldb + 1, nan);
  std::vector<float> C0(size_t(c.M) * ldc + 1, 12345.0f);
  for (int i = 0; i < a_rows; ++i)
    for (int j = 0; j < a_cols; ++j) A[size_t(i) * lda + j] = float(rng.normal());
  for (int i = 0; i < b_rows; ++i)
    for (int j = 0; j < b_cols; ++j) B[size_t(i) * ldb + j] = float(rng.normal());
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < c.N; ++j) C0[size_t(i) * ldc + j] = float(rng.normal());
  std::vector<bf16> A16(A.size()), B16(B.size());
  for (size_t i = 0; i < A.size(); ++i) A16[i] = float_to_bf16(A[i]);
  for (size_t i = 0; i < B.size(); ++i) B16[i] = float_to_bf16(B[i]);

  std::vector<float> fast = C0, fast16 = C0, ref = C0, bound(C0.size()), absA(A.size()), absB(B.size());
  gemm_bf16_f32(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, fast.data(), ldc);
  gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A16.data(), lda, B16.data(), ldb, c.beta, fast16.data(), ldc);
  gemm_reference<float>(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, ref.data(), ldc);
  for (size_t i = 0; i < A.size(); ++i) absA[i] = std::abs(A[i]);
  for (size_t i = 0; i < B.size(); ++i) absB[i] = std::abs(B[i]);
  gemm_reference<float>(c.ta, c.tb, c.M, c.N, c.K, 1.0f, absA.data(), lda, absB.data(), ldb, 0.0f, bound.data(), ldc);
  const double u = kBf16Unit, rel = 2 * u + u * u + (c.K + 3) * kU32;
  int bad = 0;
  std::ostringstream msg;
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < ldc; ++j) {
      const size_t k = size_t(i) * ldc + j;
      if (j >= c.N) {  // padding of C: untouched
        if (fast[k] != 12345.0f || fast16[k] != 12345.0f) ++bad, msg << "\n  padding C[" << i << "," << j << "]";
        continue;
      }
      const double tol = std::abs(c.alpha) * rel * bound[k] + 3 * kU32 * std::abs(c.beta * C0[k]) + 1e-30;
      for (int which = 0; which < 2; ++which) {
        const float f = which ? fast16[k] : fast[k];
        if (!(std::abs(double(f) - ref[k]) <= tol) && bad++ < 3)
          msg << "\n  C[" << i << "," << j << "]: " << (which ? "gemm_bf16 " : "gemm_bf16_f32 ") << f
              << " reference " << ref[k] << " allowed " << tol;
      }
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << (c.ta ? "T" : "N") << (c.tb ? "T" : "N") << " M=" << c.M << " N=" << c.N
                                       << " K=" << c.K << " alpha=" << c.alpha << " beta=" << c.beta
                                       << " pad=" << c.pad << ": " << bad << " bad" << msg.str();
}

TEST(GemmBf16, MatchesReferenceOnAwkwardSizes) {
  Rng rng(1);
  for (int pad : {0, 5})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int M : {1, 7, 33, 257})
          for (int N : {1, 7, 33, 257})
            for (int K : {1, 7, 33, 257})
              EXPECT_TRUE(run_case({bool(ta), bool(tb), M, N, K, 1.0f, 0.0f, pad}, rng));
}

// beta = 1 accumulates (the gradient path); other scalars; K = 0 leaves beta·C.
TEST(GemmBf16, AlphaBetaCombinations) {
  Rng rng(2);
  for (auto [alpha, beta] : {std::pair{1.0f, 1.0f}, {-2.0f, 1.0f}, {0.125f, 0.25f}, {1.5f, -0.5f}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int M : {1, 33})
          for (int N : {7, 257})
            for (int K : {0, 7, 257}) EXPECT_TRUE(run_case({bool(ta), bool(tb), M, N, K, alpha, beta, 3}, rng));
}

// Two calls with beta = 1 add twice, exactly: small integers are exact in bf16 and in fp32.
TEST(GemmBf16, BetaOneCalledTwiceAddsTwice) {
  const int M = 7, N = 33, K = 65;
  Rng rng(4);
  std::vector<bf16> A(M * K), B(K * N);
  std::vector<float> Af(M * K), Bf(K * N), P(M * N), AB(M * N);
  for (int i = 0; i < M * K; ++i) A[i] = float_to_bf16(Af[i] = float(rng.below(9)) - 4.f);
  for (int i = 0; i < K * N; ++i) B[i] = float_to_bf16(Bf[i] = float(rng.below(9)) - 4.f);
  for (auto& x : P) x = float(rng.below(201)) - 100.f;
  std::vector<float> C = P;
  gemm_reference<float>(false, false, M, N, K, 1.f, Af.data(), K, Bf.data(), N, 0.f, AB.data(), N);
  gemm_bf16(false, false, M, N, K, 1.f, A.data(), K, B.data(), N, 1.f, C.data(), N);
  gemm_bf16(false, false, M, N, K, 1.f, A.data(), K, B.data(), N, 1.f, C.data(), N);
  for (int i = 0; i < M * N; ++i) EXPECT_EQ(C[i], P[i] + 2 * AB[i]) << i;
}

// The bf16-output and batched entry points against the fp32-output single product.
TEST(GemmBf16, Bf16OutputAndBatched) {
  Rng rng(5);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int batch = 3, M = 33, N = 17, K = 65;
      const size_t sa = size_t(M) * K + 3, sb = size_t(K) * N + 1, sc = size_t(M) * N + 2;
      std::vector<bf16> A(batch * sa), B(batch * sb);
      for (auto& x : A) x = float_to_bf16(float(rng.normal()));
      for (auto& x : B) x = float_to_bf16(float(rng.normal()));
      const int lda = ta ? M : K, ldb = tb ? K : N;
      std::vector<float> C(batch * sc, 1.0f), one(sc, 1.0f);
      gemm_bf16_batched(batch, ta, tb, M, N, K, 0.5f, A.data(), lda, sa, B.data(), ldb, sb, 1.0f, C.data(), N, sc);
      for (int i = 0; i < batch; ++i) {
        std::fill(one.begin(), one.end(), 1.0f);
        gemm_bf16(ta, tb, M, N, K, 0.5f, A.data() + i * sa, lda, B.data() + i * sb, ldb, 1.0f, one.data(), N);
        std::vector<bf16> out(size_t(M) * N);
        gemm_bf16_out(ta, tb, M, N, K, 0.5f, A.data() + i * sa, lda, B.data() + i * sb, ldb, out.data(), N);
        for (int k = 0; k < M * N; ++k) {
          // Same sums, possibly in another order: a few fp32 roundings of K terms of size ~1.
          ASSERT_NEAR(C[i * sc + k], one[k], 1e-4 * K) << "batch " << i << " k " << k;
          ASSERT_EQ(out[k], float_to_bf16(one[k] - 1.0f)) << "batch " << i << " k " << k;
        }
      }
    }
}

}  // namespace
}  // namespace atl
