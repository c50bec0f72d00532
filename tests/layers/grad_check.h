// Shared helpers for the per-layer tests: deterministic random tensors, a central
// finite-difference gradient check in double, and float-versus-double comparison.
//
// The gradient check uses the usual trick: a layer with tensor output `out` is turned into a
// scalar loss L = Σ out · dout with a fixed random `dout`, so that dL/din is exactly what the
// layer's backward returns when it is fed `dout`.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "atoll/core/rng.h"

namespace atl::test {

// n standard normals times `scale`, from `rng` (deterministic for a given seed).
inline std::vector<double> randn(Rng& rng, size_t n, double scale = 1.0) {
  std::vector<double> v(n);
  for (auto& x : v) x = scale * rng.normal();
  return v;
}

// n uniforms in [lo, hi).
inline std::vector<double> randu(Rng& rng, size_t n, double lo, double hi) {
  std::vector<double> v(n);
  for (auto& x : v) x = lo + (hi - lo) * rng.uniform();
  return v;
}

// n small integers in [-range, range] stored as doubles: products and sums of these are exact
// in double, so accumulation tests can compare bit for bit whatever the summation order.
inline std::vector<double> randint(Rng& rng, size_t n, int range) {
  std::vector<double> v(n);
  for (auto& x : v) x = double(int64_t(rng.below(uint64_t(2 * range + 1))) - range);
  return v;
}

inline std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Options of the finite-difference check.
//
// Step h = 1e-5. Central differences (L(x+h) − L(x−h)) / 2h have truncation error
// h²/6 · L‴ ≈ 2e-11 · L‴ and rounding error ≈ eps · |L| / h ≈ 2e-16 · |L| / 1e-5 =
// 2e-11 · |L|; with O(1) inputs and |L| = O(1..30) both are ≲ 1e-9 absolute. h near
// eps^(1/3) ≈ 6e-6 balances the two; h = 1e-6 makes rounding ten times worse (measured over
// all the layer tests: worst ratio 2.7e-7 at h = 1e-6, 1.5e-8 at h = 1e-5).
//
// Pass criterion: |num − ana| / max(floor, |num| + |ana|) < rtol, rtol = 1e-6, floor = 1e-2.
// For gradient entries of size ≳ 1e-2 this is a 1e-6 relative test (a real bug - a missing
// term, a wrong sign, a wrong index - gives errors of order the gradient itself, a ratio of
// order 1; GradCheckHelper.FlagsWrongGradients shows a 1e-4 relative error is caught); for
// entries near zero it becomes an absolute test at 1e-8, about ten times the noise estimated
// above, so exact zeros (an expert with no rows) are not flagged by noise.
struct GradCheckOptions {
  double h = 1e-5;
  double rtol = 1e-6;
  double floor = 1e-2;
  size_t max_coords = 0;  // 0: check every coordinate; otherwise a random subset of this size
  uint64_t seed = 0x9e3779b9;
};

// Compares `ana` with central finite differences of `loss` at `x`, coordinate by coordinate.
// `loss` receives the (perturbed) input vector and returns the scalar loss in double.
template <typename F>
::testing::AssertionResult check_grad(const std::string& what, F&& loss, std::vector<double> x,
                                      const std::vector<double>& ana, const GradCheckOptions& opt = {}) {
  if (ana.size() != x.size())
    return ::testing::AssertionFailure() << what << ": gradient has " << ana.size() << " entries, input " << x.size();
  std::vector<size_t> coords(x.size());
  std::iota(coords.begin(), coords.end(), size_t(0));
  if (opt.max_coords > 0 && opt.max_coords < coords.size()) {
    Rng rng(opt.seed);  // partial Fisher-Yates: a deterministic random subset
    for (size_t i = 0; i < opt.max_coords; ++i) std::swap(coords[i], coords[i + rng.below(coords.size() - i)]);
    coords.resize(opt.max_coords);
    std::sort(coords.begin(), coords.end());
  }
  double worst = 0.0;
  size_t worst_i = 0;
  double worst_num = 0.0, worst_ana = 0.0;
  int failures = 0;
  std::ostringstream first;
  for (size_t i : coords) {
    const double x0 = x[i];
    x[i] = x0 + opt.h;
    const double lp = loss(x);
    x[i] = x0 - opt.h;
    const double lm = loss(x);
    x[i] = x0;
    const double num = (lp - lm) / (2.0 * opt.h);
    const double err = std::abs(num - ana[i]) / std::max(opt.floor, std::abs(num) + std::abs(ana[i]));
    if (!(err < opt.rtol)) {  // also catches NaN
      if (failures < 5) first << "\n  [" << i << "] numeric " << num << " analytic " << ana[i] << " rel err " << err;
      ++failures;
    }
    if (!(err <= worst)) worst = err, worst_i = i, worst_num = num, worst_ana = ana[i];
  }
  if (failures == 0) return ::testing::AssertionSuccess() << what << ": worst rel err " << worst;
  return ::testing::AssertionFailure() << what << ": " << failures << " of " << coords.size()
                                       << " coordinates differ from finite differences (rtol " << opt.rtol
                                       << "); worst at [" << worst_i << "] numeric " << worst_num << " analytic "
                                       << worst_ana << " rel err " << worst << first.str();
}

// Float against double: |f − d| ≤ rtol · (|d| + mean|d|). The mean term is a floor for entries
// that cancel to near zero; rtol 1e-5 is ~170 float unit roundoffs (6e-8), room for the O(C)
// sums of a layer accumulated in float (measured worst over the layer tests: 1.2e-6).
inline ::testing::AssertionResult float_close(const std::string& what, const std::vector<float>& f,
                                              const std::vector<double>& d, double rtol = 1e-5) {
  if (f.size() != d.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  double mean = 0.0;
  for (double v : d) mean += std::abs(v);
  mean = d.empty() ? 0.0 : mean / double(d.size());
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    const double err = std::abs(double(f[i]) - d[i]) / (std::abs(d[i]) + mean + 1e-300);
    if (!(err <= worst)) worst = err, worst_i = i;
  }
  if (worst <= rtol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": float differs from double by " << worst << " (rtol " << rtol
                                       << ") at [" << worst_i << "]: " << f[worst_i] << " vs " << d[worst_i];
}

// For (+=) outputs: `acc` should equal prefill + times · g, where g is what the backward writes
// into a zeroed buffer. Not bit for bit in general: with -march=native the compiler contracts
// `d += r * s` into fma(r, s, d), which rounds once where prefill + fl(r·s) rounds twice, and a
// BLAS may fold beta = 1 into its sums in another order. Both are a few units in the last
// place, so the slack is 8 eps · (|prefill| + times·|g|) per entry; a missing or doubled
// accumulation is off by a whole |g| or |prefill|.
inline ::testing::AssertionResult accumulated(const std::string& what, const std::vector<double>& acc,
                                              const std::vector<double>& prefill, const std::vector<double>& g,
                                              int times) {
  if (acc.size() != prefill.size() || acc.size() != g.size())
    return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < acc.size(); ++i) {
    const double expect = prefill[i] + times * g[i];
    const double slack = 8 * 2.220446049250313e-16 * (std::abs(prefill[i]) + times * std::abs(g[i]));
    if (!(std::abs(acc[i] - expect) <= slack))
      return ::testing::AssertionFailure() << what << "[" << i << "] = " << acc[i] << ", expected prefill "
                                           << prefill[i] << " + " << times << " x " << g[i] << " = " << expect;
  }
  return ::testing::AssertionSuccess();
}

// Largest |a − b| / (|a| + |b| + floor) over two double vectors.
inline double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b, double floor = 1e-300) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double err = std::abs(a[i] - b[i]) / (std::abs(a[i]) + std::abs(b[i]) + floor);
    if (!(err <= worst)) worst = err;
  }
  return worst;
}

}  // namespace atl::test
