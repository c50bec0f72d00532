#include "atoll/optim/clip.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "atoll/core/check.h"

namespace atl {

// Elements per block of the norm: large enough to amortise a task, small enough that a
// 10M-element gradient splits into enough blocks for every core.
static constexpr size_t kBlock = size_t{1} << 16;

// Sum of squares of one block, in double, with four interleaved accumulators so the additions
// pipeline; the order is fixed, hence deterministic.
static double block_sumsq(const float* g, size_t n) {
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) acc[k] += double(g[i + k]) * double(g[i + k]);
  for (; i < n; ++i) acc[0] += double(g[i]) * double(g[i]);
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// Sum of squares over n elements in fixed blocks, added in block order.
static double sumsq_blocks(const float* g, size_t n) {
  const int64_t blocks = int64_t((n + kBlock - 1) / kBlock);
  std::vector<double> partial(blocks);  // [blocks]
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t begin = size_t(b) * kBlock;
    partial[b] = block_sumsq(g + begin, std::min(kBlock, n - begin));
  }
  double sumsq = 0.0;
  for (double p : partial) sumsq += p;
  return sumsq;
}

double global_grad_norm(const float* g, size_t n) { return std::sqrt(sumsq_blocks(g, n)); }

double grad_sumsq(const float* g, size_t n, const std::vector<std::pair<size_t, size_t>>& left_out) {
  double sumsq = sumsq_blocks(g, n);
  if (!std::isfinite(sumsq)) return sumsq;
  for (const auto& [offset, count] : left_out) {
    ATOLL_CHECK_LE(offset + count, n);
    sumsq -= block_sumsq(g + offset, count);
  }
  return std::max(sumsq, 0.0);
}

double clip_grad_norm(float* g, size_t n, double max_norm, const std::vector<std::pair<size_t, size_t>>& left_out) {
  ATOLL_CHECK_GE(max_norm, 0.0);
  double norm = global_grad_norm(g, n);
  if (!left_out.empty() && std::isfinite(norm)) {
    double sumsq = norm * norm;
    for (const auto& [offset, count] : left_out) {
      ATOLL_CHECK_LE(offset + count, n);
      sumsq -= block_sumsq(g + offset, count);
    }
    norm = std::sqrt(std::max(sumsq, 0.0));
  }
  clip_to_norm(g, n, max_norm, norm);
  return norm;
}

void clip_to_norm(float* g, size_t n, double max_norm, double norm) {
  ATOLL_CHECK_GE(max_norm, 0.0);
  if (max_norm == 0.0 || !std::isfinite(norm) || norm <= max_norm) return;
  const float scale = float(max_norm / norm);
  const int64_t nn = int64_t(n);
#pragma omp parallel for simd schedule(static) if (n >= kBlock)
  for (int64_t i = 0; i < nn; ++i) g[i] *= scale;
}

}  // namespace atl
