#include "atoll/ckpt/checkpoint_plan.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "atoll/core/check.h"

namespace atl {

CheckpointPlan plan_checkpoint(const std::vector<PlanCopy>& copies, const ParamLayout& layout) {
  const auto& entries = layout.entries();
  std::vector<size_t> order(entries.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return entries[a].numel > entries[b].numel; });
  std::map<int, size_t> load;  // bytes planned per worker
  CheckpointPlan plan(copies.size(), std::vector<int>(entries.size(), -1));
  for (size_t ci = 0; ci < copies.size(); ++ci) {  // the fixed writers first: the others fill in around them
    const PlanCopy& c = copies[ci];
    if (c.writers.empty()) continue;
    ATOLL_CHECK_EQ(c.writers.size(), entries.size()) << "copy " << c.kind;
    for (size_t e = 0; e < entries.size(); ++e) {
      plan[ci][e] = c.writers[e];
      load[c.writers[e]] += entries[e].numel * sizeof(float);
    }
  }
  for (size_t ci = 0; ci < copies.size(); ++ci) {
    const PlanCopy& c = copies[ci];
    ATOLL_CHECK(!c.holders.empty()) << "copy " << c.kind << " has no holder";
    if (!c.writers.empty()) continue;
    std::vector<int>& writer = plan[ci];
    for (size_t e : order) {
      int best = c.holders.front();
      for (int h : c.holders)
        if (load[h] < load[best] || (load[h] == load[best] && h < best)) best = h;
      writer[e] = best;
      load[best] += entries[e].numel * sizeof(float);
    }
  }
  return plan;
}

}  // namespace atl
