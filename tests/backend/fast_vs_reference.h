// Helpers of the tests that hold a fast kernel of backend/cpu/ against its plain reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "atoll/core/rng.h"

namespace atl::test {

// n standard normals in T.
template <typename T>
std::vector<T> normal(Rng& rng, size_t n) {
  std::vector<T> v(n);
  for (T& x : v) x = T(rng.normal());
  return v;
}

// Largest |a - b| relative to the largest |b|: both sides sum the same products of N(0,1)
// numbers in different orders, so they agree to a few ulps of the sums' scale.
template <typename T>
double max_rel(const std::vector<T>& a, const std::vector<T>& b) {
  double scale = 1e-30, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(double(b[i])));
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
  }
  return diff / scale;
}

}  // namespace atl::test
