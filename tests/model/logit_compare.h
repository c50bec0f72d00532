// Comparing two decoders' logits (tests/model/decoder_test.cc, tests/dist/tree_decode_test.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace atl::testing {

// max |a - b| over the logits, relative to max(1, max |a|): the error against the largest.
inline double logit_error(const std::vector<float>& a, const std::vector<float>& b) {
  double big = 1, worst = 0;
  for (float x : a) big = std::max(big, double(std::fabs(x)));
  for (size_t v = 0; v < a.size(); ++v) worst = std::max(worst, std::fabs(double(a[v]) - double(b[v])) / big);
  return worst;
}

// The greedy choice: the first largest logit.
inline int32_t greedy(const std::vector<float>& logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace atl::testing
