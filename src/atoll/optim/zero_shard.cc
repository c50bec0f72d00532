#include "atoll/optim/zero_shard.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "atoll/core/check.h"

namespace atl {

std::vector<ZeroShard> zero_shards(const ParamLayout& layout, int ranks) {
  ATOLL_CHECK_GE(ranks, 1);
  const size_t n = layout.total();
  // The entry boundaries: each entry's offset, then the end of the buffer.
  std::vector<size_t> cuts;
  for (const ParamEntry& e : layout.entries()) cuts.push_back(e.offset);
  if (cuts.empty() || cuts.front() != 0) cuts.insert(cuts.begin(), 0);
  cuts.push_back(n);
  std::vector<ZeroShard> shards(ranks);
  size_t at = 0;  // index into cuts of the running boundary; boundaries never go back
  for (int r = 0; r < ranks; ++r) {
    shards[r].lo = r == 0 ? 0 : shards[r - 1].hi;
    if (r == ranks - 1) {
      shards[r].hi = n;
      break;
    }
    const double target = double(n) * double(r + 1) / double(ranks);
    while (at + 1 < cuts.size() && std::abs(double(cuts[at + 1]) - target) <= std::abs(double(cuts[at]) - target))
      ++at;
    shards[r].hi = std::max(cuts[at], shards[r].lo);
  }
  return shards;
}

std::vector<size_t> zero_shard_sizes(const ParamLayout& layout, int ranks) {
  std::vector<size_t> sizes;
  for (const ZeroShard& s : zero_shards(layout, ranks)) sizes.push_back(s.size());
  return sizes;
}

}  // namespace atl
