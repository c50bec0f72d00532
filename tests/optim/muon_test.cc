// Muon and its Newton-Schulz iteration. Oracles, cheapest first: the scalar polynomial on
// matrices with known singular values; a plain double-precision Newton-Schulz written here
// (no BLAS, multiplied from the other side); Muon's two steps by hand on a 2x3 matrix; and the
// spectrum of the output, measured with a Jacobi eigen-solver, on random, ill-conditioned and
// rank-deficient inputs of tall, wide and square shapes.
#include "atoll/optim/muon.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "atoll/core/rng.h"

namespace atl {
namespace {

using Mat = std::vector<double>;  // row-major

Mat matmul(const Mat& a, const Mat& b, int n, int k, int m) {  // [n, k] x [k, m] -> [n, m]
  Mat c(size_t(n) * m, 0.0);
  for (int i = 0; i < n; ++i)
    for (int p = 0; p < k; ++p)
      for (int j = 0; j < m; ++j) c[size_t(i) * m + j] += a[size_t(i) * k + p] * b[size_t(p) * m + j];
  return c;
}

Mat transpose(const Mat& a, int rows, int cols) {  // [rows, cols] -> [cols, rows]
  Mat t(a.size());
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) t[size_t(j) * rows + i] = a[size_t(i) * cols + j];
  return t;
}

double frobenius(const Mat& a) {
  double s = 0.0;
  for (double x : a) s += x * x;
  return std::sqrt(s);
}

// One Newton-Schulz iteration on a scalar singular value: p(s) = a s + b s^3 + c s^5.
double ns_poly(double s, int steps) {
  for (int i = 0; i < steps; ++i) s = kNsA * s + kNsB * s * s * s + kNsC * s * s * s * s * s;
  return s;
}

// Reference Newton-Schulz, always in the right-multiplied form X' = a X + X (b S + c S^2) with
// S = Xt X. Since (X Xt) X = X (Xt X), this equals the implementation's left form on the wide
// orientation while sharing none of its code paths (no transpose, no BLAS).
Mat ref_newton_schulz(const Mat& u, int rows, int cols, int steps) {
  const double scale = 1.0 / (frobenius(u) + 1e-7);
  Mat x(u.size());
  for (size_t i = 0; i < u.size(); ++i) x[i] = u[i] * scale;
  for (int s = 0; s < steps; ++s) {
    const Mat g = matmul(transpose(x, rows, cols), x, cols, rows, cols);  // [cols, cols]
    const Mat g2 = matmul(g, g, cols, cols, cols);
    Mat poly(g.size());
    for (size_t i = 0; i < g.size(); ++i) poly[i] = kNsB * g[i] + kNsC * g2[i];
    const Mat xp = matmul(x, poly, rows, cols, cols);
    for (size_t i = 0; i < x.size(); ++i) x[i] = kNsA * x[i] + xp[i];
  }
  return x;
}

// Eigenvalues of a symmetric [n, n] matrix by cyclic Jacobi rotations (Numerical Recipes
// 11.1): each rotation zeroes one off-diagonal pair; sweeps until the off-diagonal mass is at
// rounding level. Plenty for n <= 64 in a test.
std::vector<double> jacobi_eigenvalues(Mat a, int n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0.0, diag = 0.0;
    for (int p = 0; p < n; ++p)
      for (int q = 0; q < n; ++q) (p == q ? diag : off) += a[size_t(p) * n + q] * a[size_t(p) * n + q];
    if (off <= 1e-30 * diag || off == 0.0) break;
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) {
        const double apq = a[size_t(p) * n + q];
        if (apq == 0.0) continue;
        const double theta = (a[size_t(q) * n + q] - a[size_t(p) * n + p]) / (2.0 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
        for (int k = 0; k < n; ++k) {  // columns p, q
          const double akp = a[size_t(k) * n + p], akq = a[size_t(k) * n + q];
          a[size_t(k) * n + p] = c * akp - s * akq;
          a[size_t(k) * n + q] = s * akp + c * akq;
        }
        for (int k = 0; k < n; ++k) {  // rows p, q
          const double apk = a[size_t(p) * n + k], aqk = a[size_t(q) * n + k];
          a[size_t(p) * n + k] = c * apk - s * aqk;
          a[size_t(q) * n + k] = s * apk + c * aqk;
        }
      }
  }
  std::vector<double> ev(n);
  for (int i = 0; i < n; ++i) ev[i] = a[size_t(i) * n + i];
  return ev;
}

// The min(rows, cols) singular values, largest first, from the eigenvalues of the smaller Gram
// matrix. Squaring limits resolution to ~1e-8 of the largest, far below what is checked.
std::vector<double> singular_values(const Mat& x, int rows, int cols) {
  const Mat xt = transpose(x, rows, cols);
  const int k = std::min(rows, cols);
  const Mat gram = rows >= cols ? matmul(xt, x, cols, rows, cols) : matmul(x, xt, rows, cols, rows);
  std::vector<double> sv = jacobi_eigenvalues(gram, k);
  for (double& s : sv) s = std::sqrt(std::max(s, 0.0));
  std::sort(sv.begin(), sv.end(), std::greater<>());
  return sv;
}

Mat gaussian(int rows, int cols, Rng* rng) {
  Mat a(size_t(rows) * cols);
  for (double& x : a) x = rng->normal();
  return a;
}

// [n, k] with orthonormal columns: modified Gram-Schmidt on Gaussian columns.
Mat orthonormal_columns(int n, int k, Rng* rng) {
  Mat q = gaussian(n, k, rng);
  for (int j = 0; j < k; ++j) {
    for (int i = 0; i < j; ++i) {
      double d = 0.0;
      for (int r = 0; r < n; ++r) d += q[size_t(r) * k + i] * q[size_t(r) * k + j];
      for (int r = 0; r < n; ++r) q[size_t(r) * k + j] -= d * q[size_t(r) * k + i];
    }
    double norm = 0.0;
    for (int r = 0; r < n; ++r) norm += q[size_t(r) * k + j] * q[size_t(r) * k + j];
    for (int r = 0; r < n; ++r) q[size_t(r) * k + j] /= std::sqrt(norm);
  }
  return q;
}

std::vector<float> to_float(const Mat& a) { return std::vector<float>(a.begin(), a.end()); }
Mat to_double(const std::vector<float>& a) { return Mat(a.begin(), a.end()); }

TEST(Jacobi, RecoversKnownSpectrum) {
  // Q diag(d) Qt with a random orthogonal Q: the oracle of the spectrum tests, checked first.
  Rng rng(11);
  const int n = 9;
  const Mat q = orthonormal_columns(n, n, &rng);
  Mat qd = q;
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < n; ++c) qd[size_t(r) * n + c] *= double(c + 1);
  std::vector<double> ev = jacobi_eigenvalues(matmul(qd, transpose(q, n, n), n, n, n), n);
  std::sort(ev.begin(), ev.end());
  for (int i = 0; i < n; ++i) EXPECT_NEAR(ev[i], i + 1, 1e-12);
}

TEST(NewtonSchulz, ScalarPolynomialOnKnownSingularValues) {
  // U = [[3,0,0],[0,1,0]] has singular values 3 and 1 along the axes; normalised by
  // ||U||_F = sqrt(10), each becomes p^5(s/sqrt(10)) and the axes stay. Its transpose takes
  // the tall path.
  const Mat u = {3, 0, 0, 0, 1, 0};  // [2, 3]
  const double s1 = ns_poly(3.0 / (std::sqrt(10.0) + 1e-7), 5), s2 = ns_poly(1.0 / (std::sqrt(10.0) + 1e-7), 5);
  const Mat want = {s1, 0, 0, 0, s2, 0};
  Mat out_d(6);
  newton_schulz(out_d.data(), u.data(), 2, 3, 5);
  std::vector<float> in_f = to_float(u), out_f(6);
  newton_schulz(out_f.data(), in_f.data(), 2, 3, 5);
  const std::vector<float> in_t = to_float(transpose(u, 2, 3));
  std::vector<float> out_t(6);
  newton_schulz(out_t.data(), in_t.data(), 3, 2, 5);
  const Mat want_t = transpose(want, 2, 3);
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(out_d[i], want[i], 1e-13);  // double: rounding of a few operations
    // fp32: five iterations amplify the ~1e-7 input rounding by at most |p'| <= a = 3.44 each.
    EXPECT_NEAR(out_f[i], want[i], 1e-4);
    EXPECT_NEAR(out_t[i], want_t[i], 1e-4);
  }
}

TEST(NewtonSchulz, MatchesPlainReferenceOnAllShapes) {
  Rng rng(5);
  for (auto [rows, cols] : {std::pair{7, 4}, {4, 7}, {6, 6}, {1, 5}, {5, 1}}) {
    const Mat u = gaussian(rows, cols, &rng);
    const Mat want = ref_newton_schulz(u, rows, cols, 5);
    Mat out(u.size());
    newton_schulz(out.data(), u.data(), rows, cols, 5);
    std::vector<float> in_f = to_float(u), out_f(u.size());
    newton_schulz(out_f.data(), in_f.data(), rows, cols, 5);  // in place below
    std::vector<float> inplace = in_f;
    newton_schulz(inplace.data(), inplace.data(), rows, cols, 5);
    for (size_t i = 0; i < u.size(); ++i) {
      EXPECT_NEAR(out[i], want[i], 1e-12) << rows << "x" << cols;   // different summation order only
      EXPECT_NEAR(out_f[i], want[i], 1e-4) << rows << "x" << cols;  // fp32, see above
      EXPECT_EQ(inplace[i], out_f[i]);
    }
  }
}

// The smallest normalised singular value that five steps lift to 0.6, by bisection (p^5 is
// increasing near 0). p is ~a s near 0, so five steps multiply a small singular value by at
// most a^5 = 3.4445^5 ~ 488: a direction below ~1e-3 of the Frobenius norm cannot reach 1 in 5
// steps (this gives 1.30e-3), and on [reach, 1] p^5 stays within [0.6, 1.21].
double ns_reach() {
  double lo = 1e-6, hi = 0.1;
  for (int i = 0; i < 100; ++i) (ns_poly(0.5 * (lo + hi), 5) < 0.6 ? lo : hi) = 0.5 * (lo + hi);
  return hi;
}

// Runs the fp32 Newton-Schulz on u [rows, cols] and checks its spectrum: every singular value
// is the scalar map p^5 of the matching normalised input one (the iteration keeps the singular
// vectors); the top `rank` lie in [0.6, 1.3] when they are within reach; the rest are null
// directions and stay near 0. Returns how many directions were out of reach (range unchecked).
int check_spectrum(const Mat& u, int rows, int cols, int rank, const char* what) {
  SCOPED_TRACE(::testing::Message() << what << " " << rows << "x" << cols);
  std::vector<float> in = to_float(u), out(u.size());
  MuonWorkspace ws;
  newton_schulz(out.data(), in.data(), rows, cols, 5, &ws);
  const std::vector<double> sv_out = singular_values(to_double(out), rows, cols);
  const std::vector<double> sv_in = singular_values(to_double(in), rows, cols);
  const double norm = frobenius(to_double(in)) + 1e-7, reach = ns_reach();
  std::vector<double> want(rank);
  int out_of_reach = 0;
  for (int i = 0; i < rank; ++i) {
    want[i] = ns_poly(sv_in[i] / norm, 5);
    out_of_reach += sv_in[i] / norm < reach;
  }
  std::sort(want.begin(), want.end(), std::greater<>());
  for (int i = 0; i < rank; ++i) {
    // fp32 products carry ~1e-7 relative error per iteration, amplified by at most |p'| <= a
    // per later step along the smallest directions: a few 1e-6 at worst (seen: <= 1e-6).
    EXPECT_NEAR(sv_out[i], want[i], 1e-4) << i;
    if (i >= rank - out_of_reach) continue;  // the smallest ones, sorted last
    EXPECT_GE(sv_out[i], 0.6) << i;
    EXPECT_LE(sv_out[i], 1.3) << i;
  }
  // Null directions: the fp32 rounding of the input (~6e-8 relative) leaves a component there
  // that the iteration amplifies by at most ~500, so it stays below 1e-4.
  for (size_t i = rank; i < sv_out.size(); ++i) EXPECT_LT(sv_out[i], 1e-4) << i;
  return out_of_reach;
}

const std::pair<int, int> kShapes[] = {{64, 16}, {16, 64}, {33, 33}};

TEST(NewtonSchulz, SpectrumOfGaussianInputs) {
  Rng rng(1);
  for (auto [rows, cols] : kShapes) {
    const int out_of_reach = check_spectrum(gaussian(rows, cols, &rng), rows, cols, std::min(rows, cols), "gaussian");
    // A rectangular Gaussian is well conditioned (singular values sqrt(n) +- sqrt(m)). A square
    // one has its smallest singular value near 1/n of the Frobenius norm and sometimes far
    // below, out of reach of five steps by chance; there only the p^5 oracle applies.
    if (rows != cols) {
      EXPECT_EQ(out_of_reach, 0);
    }
  }
}

TEST(NewtonSchulz, SpectrumOfIllConditionedInputs) {
  // Q1 diag(s) Q2t with s log-spaced from 1 to 1e-2: condition number 100.
  Rng rng(2);
  for (auto [rows, cols] : kShapes) {
    const int k = std::min(rows, cols);
    Mat q1 = orthonormal_columns(rows, k, &rng);        // [rows, k]
    const Mat q2 = orthonormal_columns(cols, k, &rng);  // [cols, k]
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < k; ++j) q1[size_t(r) * k + j] *= std::pow(10.0, -2.0 * j / (k - 1));
    const Mat u = matmul(q1, transpose(q2, cols, k), rows, k, cols);
    ASSERT_NEAR(singular_values(u, rows, cols).front() / singular_values(u, rows, cols).back(), 100.0, 1e-6);
    // The smallest direction is 1e-2/||s|| >= 5e-3 of the norm: all within reach.
    EXPECT_EQ(check_spectrum(u, rows, cols, k, "ill-conditioned"), 0);
  }
}

TEST(NewtonSchulz, SpectrumOfRankDeficientInputs) {
  // A Bt with A [rows, 4], B [cols, 4]: four directions, the rest exactly null.
  Rng rng(3);
  for (auto [rows, cols] : kShapes) {
    const Mat a = gaussian(rows, 4, &rng), b = gaussian(cols, 4, &rng);
    EXPECT_EQ(check_spectrum(matmul(a, transpose(b, cols, 4), rows, 4, cols), rows, cols, 4, "rank 4"), 0);
  }
}

TEST(Muon, TwoStepsByHandOn2x3) {
  // Moonlight's Muon written out for two steps, with the plain reference Newton-Schulz:
  //   buf1 = G1,              U1 = G1 + mu buf1 = 1.95 G1
  //   buf2 = mu G1 + G2,      U2 = G2 + mu buf2
  //   p_t  = p_{t-1} (1 - lr wd) - lr 0.2 sqrt(3) NS(U_t)
  const MuonOptions opt{.lr = 0.1, .momentum = 0.95, .weight_decay = 0.1, .ns_steps = 5};
  const Mat p0 = {0.5, -1.0, 0.25, 2.0, 0.0, -0.75};
  const Mat g1 = {1.0, 2.0, -1.0, 0.5, -0.5, 3.0}, g2 = {-2.0, 0.25, 1.0, 1.5, 2.0, -1.0};
  std::vector<float> p = to_float(p0), buf(6, 0.0f);
  const std::vector<float> g1f = to_float(g1), g2f = to_float(g2);
  MuonWorkspace ws;

  Mat u1(6), buf1(6), u2(6), buf2(6), p1(6), p2(6);
  for (int i = 0; i < 6; ++i) buf1[i] = g1[i], u1[i] = g1[i] + 0.95 * buf1[i];
  const Mat o1 = ref_newton_schulz(u1, 2, 3, 5);
  const double scale = 0.1 * 0.2 * std::sqrt(3.0);
  for (int i = 0; i < 6; ++i) p1[i] = p0[i] * (1.0 - 0.1 * 0.1) - scale * o1[i];
  for (int i = 0; i < 6; ++i) buf2[i] = 0.95 * buf1[i] + g2[i], u2[i] = g2[i] + 0.95 * buf2[i];
  const Mat o2 = ref_newton_schulz(u2, 2, 3, 5);
  for (int i = 0; i < 6; ++i) p2[i] = p1[i] * (1.0 - 0.1 * 0.1) - scale * o2[i];

  // Update entries are ~0.035 * O with O accurate to ~1e-4 in fp32 (see above): 1e-5.
  muon_update(p.data(), buf.data(), g1f.data(), 2, 3, opt, &ws);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(buf[i], g1f[i]);  // 0.95 * 0 + g is exact
    EXPECT_NEAR(p[i], p1[i], 1e-5) << i;
  }
  muon_update(p.data(), buf.data(), g2f.data(), 2, 3, opt, &ws);
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(buf[i], buf2[i], 1e-6) << i;  // two fp32 operations on values of order 1
    EXPECT_NEAR(p[i], p2[i], 1e-5) << i;
  }
}

TEST(Muon, ManyMatricesEqualOneAtATime) {
  // An expert tensor [3, 5, 4] and a [4, 7] matrix, in one flat buffer with a gap. Each
  // matrix is the same fixed sequence of operations either way, so results are bit-identical
  // whether threads take whole matrices or they run in turn.
  const std::vector<MuonMatrix> mats = {{.offset = 0, .rows = 5, .cols = 4},
                                        {.offset = 20, .rows = 5, .cols = 4},
                                        {.offset = 40, .rows = 5, .cols = 4},
                                        {.offset = 64, .rows = 4, .cols = 7, .decay = false}};
  const size_t total = 64 + 28;
  Rng rng(9);
  std::vector<float> p(total), g(total), buf(total, 0.0f);
  for (size_t i = 0; i < total; ++i) p[i] = float(rng.normal()), g[i] = float(rng.normal());
  std::vector<float> p_ref = p, buf_ref = buf;
  const MuonOptions opt{.lr = 0.02, .momentum = 0.95, .weight_decay = 0.1, .ns_steps = 5};
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(2);  // at least as many matrices as threads: the parallel path
  std::vector<MuonWorkspace> ws;
  for (int step = 0; step < 2; ++step) {
    muon_update_many(p.data(), buf.data(), g.data(), mats, opt, &ws);
    MuonWorkspace one;
    for (const MuonMatrix& m : mats) {
      MuonOptions o = opt;
      if (!m.decay) o.weight_decay = 0.0;
      muon_update(p_ref.data() + m.offset, buf_ref.data() + m.offset, g.data() + m.offset, m.rows, m.cols, o, &one);
    }
  }
  omp_set_num_threads(saved_threads);
  EXPECT_EQ(p, p_ref);
  EXPECT_EQ(buf, buf_ref);
  for (size_t i = 60; i < 64; ++i) EXPECT_EQ(p[i], p_ref[i]);  // the gap is untouched
}


// The batched bf16 Newton-Schulz against the fp32 one, matrix by matrix, on Gaussian batches
// of tall, wide, square and odd shapes. Each product rounds its inputs to bf16 (u = 2^-8);
// X stays fp32 between steps, so the errors do not compound but are amplified by the
// polynomial's slope (|p'| <= a = 3.4 along small directions) for the remaining steps: a few
// u. We allow 6% relative Frobenius difference (measured 2-3.5%) and, for the orthogonality
// the optimizer needs, singular values within 0.08 of the fp32 ones (measured <= 0.045; the
// fp32 ones themselves spread over [0.6, 1.3] by design, see check_spectrum).
TEST(NewtonSchulzBf16, AgreesWithFp32) {
  Rng rng(11);
  for (auto [rows, cols] : {std::pair{64, 16}, {16, 64}, {33, 33}, {96, 40}}) {
    const int count = 3;
    const size_t n = size_t(rows) * cols;
    std::vector<float> in(count * n), out(count * n), ref(count * n);
    for (auto& x : in) x = float(rng.normal());
    MuonWorkspace ws;
    newton_schulz_bf16(out.data(), in.data(), count, rows, cols, 5, &ws);
    double worst_rel = 0, worst_sv = 0;
    for (int i = 0; i < count; ++i) {
      newton_schulz(ref.data() + i * n, in.data() + i * n, rows, cols, 5, &ws);
      const Mat o16(out.begin() + i * n, out.begin() + (i + 1) * n), o32(ref.begin() + i * n, ref.begin() + (i + 1) * n);
      Mat d(n);
      for (size_t k = 0; k < n; ++k) d[k] = o16[k] - o32[k];
      worst_rel = std::max(worst_rel, frobenius(d) / frobenius(o32));
      const auto sv16 = singular_values(o16, rows, cols), sv32 = singular_values(o32, rows, cols);
      for (size_t k = 0; k < sv16.size(); ++k) worst_sv = std::max(worst_sv, std::abs(sv16[k] - sv32[k]));
    }
    EXPECT_LT(worst_rel, 0.06) << rows << "x" << cols;
    EXPECT_LT(worst_sv, 0.08) << rows << "x" << cols;
    std::printf("  %dx%d: relative difference %.4f, singular values within %.4f\n", rows, cols, worst_rel, worst_sv);
    // In place, as muon_update_many calls it.
    std::vector<float> inplace = in;
    newton_schulz_bf16(inplace.data(), inplace.data(), count, rows, cols, 5, &ws);
    EXPECT_EQ(inplace, out);
  }
}

// muon_update_many with bf16 Newton-Schulz against the fp32 path on a mixed list (two shapes,
// interleaved, one without decay): same momentum exactly (elementwise fp32 either way), and
// parameters within the Newton-Schulz tolerance above times the update scale.
TEST(Muon, ManyMatricesBf16CloseToFp32) {
  const std::vector<MuonMatrix> mats = {{.offset = 0, .rows = 40, .cols = 24},
                                        {.offset = 960, .rows = 24, .cols = 24, .decay = false},
                                        {.offset = 1536, .rows = 40, .cols = 24}};
  const size_t total = 1536 + 960;
  Rng rng(12);
  std::vector<float> p(total), g(total), buf(total, 0.0f);
  for (size_t i = 0; i < total; ++i) p[i] = float(rng.normal()), g[i] = float(rng.normal());
  std::vector<float> p16 = p, buf16 = buf;
  MuonOptions opt{.lr = 0.02, .momentum = 0.95, .weight_decay = 0.1, .ns_steps = 5};
  std::vector<MuonWorkspace> ws;
  muon_update_many(p.data(), buf.data(), g.data(), mats, opt, &ws);
  opt.bf16 = true;
  muon_update_many(p16.data(), buf16.data(), g.data(), mats, opt, &ws);
  EXPECT_EQ(buf16, buf);
  const double step = 0.02 * 0.2 * std::sqrt(40.0);  // lr * RMS scale: update entries are ~step * O
  for (size_t i = 0; i < total; ++i) EXPECT_NEAR(p16[i], p[i], 0.1 * step) << i;
}

}  // namespace
}  // namespace atl
