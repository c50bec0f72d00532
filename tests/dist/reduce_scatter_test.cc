// ProcessGroup::reduce_scatter_sum (ZeRO-1's gradient exchange, optim/zero_shard.h), every rank
// a real process over Gloo: rank r's part ends as the sum of every rank's part r, against
// Gloo's all-reduce sum of the same data: bit for bit with two ranks (a + b = b + a), and with
// three or four to within the bound of two summation orders of P floats, 2(P-1)u·Σ|x|
// (u = 2^-24), on parts of awkward sizes (empty, 1, odd, larger than a bucket).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "atoll/core/rng.h"
#include "atoll/dist/group.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using testing::run_processes;

class ReduceScatter : public testing::RedisSuite {};

std::vector<float> data_of(int rank, size_t n) {
  Rng rng(uint64_t(rank) * 7919 + 1);
  std::vector<float> x(n);
  for (auto& v : x) v = float(rng.uniform() - 0.5) * float(1 << (rank % 4));  // magnitudes that differ per rank
  return x;
}

TEST_F(ReduceScatter, EachRankReceivesTheSumOfItsPartAsGloosAllreduceDoes) {
  for (int size = 1; size <= 4; ++size) {
    const std::string run = "rs" + std::to_string(size);
    const auto out = run_processes(size, [&](int rank) -> std::string {
      Store store(store_options(run));
      ProcessGroup g(store, GroupOptions{.rank = rank, .size = size});
      const std::vector<size_t> all = {0, 1, 4099, 70001};  // empty, one element, odd, several blocks
      std::vector<size_t> counts(all.begin(), all.begin() + size);
      std::rotate(counts.begin(), counts.begin() + size / 2, counts.end());  // the empty part is not rank 0's
      size_t n = 0, lo = 0;
      for (int r = 0; r < size; ++r) (r < rank ? lo : n) += counts[r];
      n += lo;
      std::vector<std::vector<float>> every;
      for (int r = 0; r < size; ++r) every.push_back(data_of(r, n));
      const std::vector<float>& mine = every[rank];
      std::vector<float> rs = mine, ar = mine;
      g.reduce_scatter_sum(rs.data(), counts);
      g.allreduce_sum(ar.data(), n);
      for (size_t i = 0; i < n; ++i) {
        const bool own = i >= lo && i < lo + counts[rank];
        if (!own) {
          if (std::memcmp(&rs[i], &mine[i], sizeof(float)) != 0) return "element " + std::to_string(i) + " of another part changed";
          continue;
        }
        double abs_sum = 0;
        for (int r = 0; r < size; ++r) abs_sum += std::fabs(double(every[r][i]));
        const double bound = 2.0 * (size - 1) * std::ldexp(1.0, -24) * abs_sum;
        const double diff = std::fabs(double(rs[i]) - double(ar[i]));
        if (size <= 2 && std::memcmp(&rs[i], &ar[i], sizeof(float)) != 0)
          return "element " + std::to_string(i) + " differs from the all-reduce with " + std::to_string(size) + " ranks";
        if (diff > bound) return "element " + std::to_string(i) + " off by " + std::to_string(diff) + " > " + std::to_string(bound);
      }
      return std::string("ok");
    });
    for (int r = 0; r < size; ++r) EXPECT_EQ(out[r], "ok") << "size " << size << " rank " << r;
  }
}

}  // namespace
}  // namespace atl
