// gemm (OpenBLAS) against gemm_reference (the plain triple loop, accumulating in double):
// all four transpose combinations, alpha/beta, padded leading dimensions, awkward and empty
// sizes, in float and double.
#include "atoll/backend/cpu/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <sstream>
#include <vector>

#include "atoll/core/rng.h"

namespace atl {
namespace {

// Unit roundoff of T.
template <typename T>
constexpr double kU = std::numeric_limits<T>::epsilon() / 2;

// Sentinel in the padding columns of C (beyond N, inside ldc): must come back untouched.
constexpr double kSentinel = 12345.0;

// A row-major matrix of `rows` × `cols` inside a buffer with leading dimension ld ≥ cols. The
// padding is NaN for inputs (so reading it would poison the result) and kSentinel for outputs.
template <typename T>
struct Mat {
  int rows = 0, cols = 0, ld = 0;
  std::vector<T> v;
  Mat(int r, int c, int pad, double pad_value) : rows(r), cols(c), ld(c + pad), v(size_t(r) * (c + pad) + 1) {
    for (auto& x : v) x = T(pad_value);
  }
  T& at(int i, int j) { return v[size_t(i) * ld + j]; }
  T at(int i, int j) const { return v[size_t(i) * ld + j]; }
  void fill_normal(Rng& rng) {
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) at(i, j) = T(rng.normal());
  }
  Mat abs() const {
    Mat m = *this;
    for (auto& x : m.v) x = std::abs(x);
    return m;
  }
};

template <typename T>
struct Case {
  bool ta, tb;
  int M, N, K;
  T alpha, beta;
  int pad;
  bool nan_c = false;  // fill C with NaN (only meaningful with beta = 0)
};

template <typename T>
::testing::AssertionResult run_case(const Case<T>& c, Rng& rng) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // op(A) is M×K: A is stored M×K, or K×M when transposed. Likewise op(B) is K×N.
  Mat<T> A(c.ta ? c.K : c.M, c.ta ? c.M : c.K, c.pad, nan);
  Mat<T> B(c.tb ? c.N : c.K, c.tb ? c.K : c.N, c.pad, nan);
  Mat<T> C0(c.M, c.N, c.pad, kSentinel);
  A.fill_normal(rng);
  B.fill_normal(rng);
  if (c.nan_c) {
    for (int i = 0; i < c.M; ++i)
      for (int j = 0; j < c.N; ++j) C0.at(i, j) = T(nan);
  } else {
    C0.fill_normal(rng);
  }
  // BLAS needs ld ≥ 1 even for an empty matrix.
  const int lda = std::max(A.ld, 1), ldb = std::max(B.ld, 1), ldc = std::max(C0.ld, 1);
  Mat<T> fast = C0, ref = C0;
  gemm<T>(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.v.data(), lda, B.v.data(), ldb, c.beta, fast.v.data(), ldc);
  gemm_reference<T>(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.v.data(), lda, B.v.data(), ldb, c.beta, ref.v.data(), ldc);
  // Error bound per entry: a K-term dot product in precision u is off by at most
  // γ_K · Σ_k |a_ik||b_kj| (Higham, Accuracy and Stability, §3.1); scaling by alpha, adding
  // beta·c and the reference's own final rounding add a few u. So
  // |fast − ref| ≤ (K + 3) · u · (|alpha| Σ|a||b| + |beta||c|), whatever order or FMA the BLAS uses.
  Mat<T> bound = C0.abs();
  if (c.nan_c) bound = Mat<T>(c.M, c.N, c.pad, 0.0);
  const Mat<T> absA = A.abs(), absB = B.abs();
  gemm_reference<T>(c.ta, c.tb, c.M, c.N, c.K, std::abs(c.alpha), absA.v.data(), lda, absB.v.data(), ldb,
                    std::abs(c.beta), bound.v.data(), ldc);
  const double tol = (c.K + 3) * kU<T>;
  int bad = 0;
  std::ostringstream msg;
  for (int i = 0; i < c.M; ++i) {
    for (int j = 0; j < c.N; ++j) {
      const double f = fast.at(i, j), r = ref.at(i, j);
      const bool ok = std::isfinite(f) && std::isfinite(r) && std::abs(f - r) <= tol * bound.at(i, j);
      if (!ok && bad++ < 3)
        msg << "\n  C[" << i << "," << j << "]: gemm " << f << " reference " << r << " allowed "
            << tol * bound.at(i, j);
    }
    for (int j = c.N; j < C0.ld; ++j)
      if (fast.at(i, j) != T(kSentinel) || ref.at(i, j) != T(kSentinel)) {
        if (bad++ < 3) msg << "\n  padding C[" << i << "," << j << "] written";
      }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << (c.ta ? "T" : "N") << (c.tb ? "T" : "N") << " M=" << c.M << " N=" << c.N
                                       << " K=" << c.K << " alpha=" << c.alpha << " beta=" << c.beta << " pad=" << c.pad
                                       << (c.nan_c ? " (C NaN)" : "") << ": " << bad << " bad entries" << msg.str();
}

template <typename T>
class Gemm : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Gemm, Scalars);

const int kSizes[] = {0, 1, 7, 33, 65, 130};

// Rung 1 of the ladder: the reference itself on a product worked by hand, all transposes.
TYPED_TEST(Gemm, ReferenceMatchesHandWorkedProduct) {
  using T = TypeParam;
  const T a[] = {1, 2, 3, 4}, at[] = {1, 3, 2, 4};  // [[1,2],[3,4]] and its transpose
  const T b[] = {5, 6, 7, 8}, bt[] = {5, 7, 6, 8};  // [[5,6],[7,8]] and its transpose
  const T expect[] = {19, 22, 43, 50};
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      T c[4] = {100, 100, 100, 100};
      gemm_reference<T>(ta, tb, 2, 2, 2, T(1), ta ? at : a, 2, tb ? bt : b, 2, T(0), c, 2);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(c[i], expect[i]) << "ta=" << ta << " tb=" << tb;
      T d[4] = {1, 1, 1, 1};  // 2·AB − 1·D
      gemm<T>(ta, tb, 2, 2, 2, T(2), ta ? at : a, 2, tb ? bt : b, 2, T(-1), d, 2);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(d[i], 2 * expect[i] - 1) << "ta=" << ta << " tb=" << tb;
    }
}

// Every (M, N, K) from the awkward sizes, four transposes, tight and padded leading dims.
TYPED_TEST(Gemm, MatchesReferenceOnAwkwardSizes) {
  using T = TypeParam;
  Rng rng(1);
  for (int pad : {0, 7})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int M : kSizes)
          for (int N : kSizes)
            for (int K : kSizes) EXPECT_TRUE(run_case<T>({bool(ta), bool(tb), M, N, K, T(1.5), T(-0.5), pad}, rng));
}

// beta = 0 means C is not read: NaN (or Inf) in C must not reach the result.
TYPED_TEST(Gemm, BetaZeroIgnoresNanInC) {
  using T = TypeParam;
  Rng rng(2);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int M : {1, 7, 65})
        for (int N : {1, 33, 130})
          for (int K : {0, 1, 33}) {
            EXPECT_TRUE(run_case<T>({bool(ta), bool(tb), M, N, K, T(1), T(0), 3, true}, rng));
            EXPECT_TRUE(run_case<T>({bool(ta), bool(tb), M, N, K, T(0.75), T(0), 0, true}, rng));
          }
}

// beta = 1 accumulates onto C (the weight-gradient path); other alphas and betas too.
TYPED_TEST(Gemm, AlphaBetaCombinations) {
  using T = TypeParam;
  Rng rng(3);
  for (auto [alpha, beta] : {std::pair{1.0, 1.0}, {-2.0, 1.0}, {1.0, 0.25}, {0.0, 1.0}, {0.0, -3.0}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int M : {1, 7, 33})
          for (int N : {7, 65})
            for (int K : {0, 1, 130})
              EXPECT_TRUE(run_case<T>({bool(ta), bool(tb), M, N, K, T(alpha), T(beta), 2}, rng));
}

// beta = 1 called twice on a prefilled C adds A·B twice (the accumulation the weight gradients
// rely on). Small integers keep every sum exact, so the comparison is bit for bit.
TYPED_TEST(Gemm, BetaOneCalledTwiceAddsTwice) {
  using T = TypeParam;
  const int M = 7, N = 33, K = 65;
  Rng rng(4);
  std::vector<T> A(M * K), B(K * N), P(M * N), C(M * N), AB(M * N, T(0));
  for (auto& x : A) x = T(rng.below(9)) - T(4);
  for (auto& x : B) x = T(rng.below(9)) - T(4);
  for (auto& x : P) x = T(rng.below(201)) - T(100);
  C = P;
  gemm<T>(false, false, M, N, K, T(1), A.data(), K, B.data(), N, T(0), AB.data(), N);
  gemm<T>(false, false, M, N, K, T(1), A.data(), K, B.data(), N, T(1), C.data(), N);
  gemm<T>(false, false, M, N, K, T(1), A.data(), K, B.data(), N, T(1), C.data(), N);
  for (int i = 0; i < M * N; ++i) EXPECT_EQ(C[i], P[i] + 2 * AB[i]) << i;
}

// Empty products: M or N = 0 touches nothing; K = 0 leaves beta·C (0 for beta = 0, even if C
// held NaN), as BLAS defines it.
TYPED_TEST(Gemm, EmptyDimensions) {
  using T = TypeParam;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const T a[1] = {nan}, b[1] = {nan};
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      std::vector<T> c = {T(kSentinel), T(kSentinel)};
      gemm<T>(ta, tb, 0, 2, 3, T(1), a, 3, b, 2, T(0), c.data(), 2);
      gemm<T>(ta, tb, 2, 0, 3, T(1), a, 3, b, 1, T(0), c.data(), 1);
      gemm_reference<T>(ta, tb, 0, 2, 3, T(1), a, 3, b, 2, T(0), c.data(), 2);
      gemm_reference<T>(ta, tb, 2, 0, 3, T(1), a, 3, b, 1, T(0), c.data(), 1);
      EXPECT_EQ(c[0], T(kSentinel));
      EXPECT_EQ(c[1], T(kSentinel));

      std::vector<T> z = {nan, nan, nan, nan, nan, nan}, zr = z;  // 2×2 inside ldc 3
      z[2] = zr[2] = z[5] = zr[5] = T(kSentinel);
      gemm<T>(ta, tb, 2, 2, 0, T(1), a, 1, b, 2, T(0), z.data(), 3);
      gemm_reference<T>(ta, tb, 2, 2, 0, T(1), a, 1, b, 2, T(0), zr.data(), 3);
      for (int i : {0, 1, 3, 4}) {
        EXPECT_EQ(z[i], T(0));
        EXPECT_EQ(zr[i], T(0));
      }
      EXPECT_EQ(z[2], T(kSentinel));
      EXPECT_EQ(z[5], T(kSentinel));

      std::vector<T> s = {1, 2, 3, 4}, sr = s;
      gemm<T>(ta, tb, 2, 2, 0, T(1), a, 1, b, 2, T(0.5), s.data(), 2);
      gemm_reference<T>(ta, tb, 2, 2, 0, T(1), a, 1, b, 2, T(0.5), sr.data(), 2);
      EXPECT_EQ(s, (std::vector<T>{0.5, 1, 1.5, 2}));
      EXPECT_EQ(sr, s);
    }
}

}  // namespace
}  // namespace atl
