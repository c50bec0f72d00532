#include "atoll/dist/expert_merge.h"

#include <algorithm>

#include "atoll/core/check.h"

namespace atl {

std::vector<ExpertSpan> fragment_expert_spans(const std::vector<ExpertSpan>& theta_spans, const FragmentPlan& plan,
                                              int f, size_t lo, size_t hi) {
  std::vector<ExpertSpan> out;
  size_t k = 0;  // flat position of the range's first element
  for (const ElementRange& r : plan.ranges[size_t(f)]) {
    for (const ExpertSpan& s : theta_spans) {
      const size_t b = std::max(s.begin, r.begin), e = std::min(s.end, r.end);
      if (b >= e) continue;
      const size_t fb = std::max(k + (b - r.begin), lo), fe = std::min(k + (e - r.begin), hi);
      if (fb < fe) out.push_back({.begin = fb - lo, .end = fe - lo, .slot = s.slot});
    }
    k += r.size();
  }
  return out;  // ascending: ranges ascend, and the spans ascend within each
}

std::vector<double> expert_factors(const std::vector<std::vector<double>>& counts, const std::vector<bool>& kept,
                                   int me, double clip) {
  const int P = int(counts.size());
  ATOLL_CHECK(P > 0 && me >= 0 && me < P && kept.size() == counts.size());
  const size_t slots = counts[size_t(me)].size();
  std::vector<double> factor(slots, 0.0);
  if (!kept[size_t(me)]) return factor;
  for (size_t s = 0; s < slots; ++s) {
    double sum = 0;
    for (int m = 0; m < P; ++m) {
      ATOLL_CHECK_EQ(counts[size_t(m)].size(), slots) << "member " << m << "'s expert counts";
      if (kept[size_t(m)]) sum += counts[size_t(m)][s];
    }
    if (sum > 0) factor[s] = double(P) * clip * counts[size_t(me)][s] / sum;
  }
  return factor;
}

std::vector<int> unused_slots(const std::vector<std::vector<double>>& counts, const std::vector<bool>& kept) {
  std::vector<int> out;
  const size_t slots = counts.empty() ? 0 : counts[0].size();
  for (size_t s = 0; s < slots; ++s) {
    bool used = false;
    for (size_t m = 0; m < counts.size(); ++m) used = used || (kept[m] && counts[m][s] > 0);
    if (!used) out.push_back(int(s));
  }
  return out;
}

}  // namespace atl
