#include "atoll/optim/bias_balance.h"

#include <algorithm>
#include <cmath>

#include "atoll/core/check.h"

namespace atl {
namespace {

// p_e over the E experts of a row of E+1 classes; empty when no slot went to an expert.
std::vector<double> expert_shares(const float* g, size_t classes) {
  ATOLL_CHECK_GE(classes, size_t(2)) << "a balanced row holds E experts and the skip class";
  const size_t E = classes - 1;
  double routed = 0;
  for (size_t e = 0; e < E; ++e) routed += g[e];
  if (!(routed > 0)) return {};
  std::vector<double> p(E);
  for (size_t e = 0; e < E; ++e) p[e] = g[e] / routed;
  return p;
}

// entropy H(p)/ln E, max and min of the expert shares p (none: left at 0).
RouterLoad with_shares(RouterLoad load, const std::vector<double>& p) {
  if (p.empty()) return load;
  double h = 0;
  for (double x : p)
    if (x > 0) h -= x * std::log(x);
  load.entropy = p.size() > 1 ? h / std::log(double(p.size())) : 1.0;
  load.max_load = *std::max_element(p.begin(), p.end());
  load.min_load = *std::min_element(p.begin(), p.end());
  return load;
}

}  // namespace

std::vector<const ParamEntry*> balanced_rows(const ParamLayout& layout) {
  std::vector<const ParamEntry*> rows;
  for (const ParamEntry& e : layout.entries())
    if (e.balanced) rows.push_back(&e);
  return rows;
}

std::vector<std::pair<size_t, size_t>> balanced_spans(const ParamLayout& layout) {
  std::vector<std::pair<size_t, size_t>> spans;
  for (const ParamEntry* e : balanced_rows(layout)) spans.emplace_back(e->offset, e->numel);
  return spans;
}

RouterLoad router_load(const float* grads, const ParamEntry& row) {
  const float* g = grads + row.offset;
  RouterLoad load{.layer = row.layer};
  double all = 0;
  for (size_t e = 0; e < row.numel; ++e) all += g[e];
  if (all > 0) load.skip_share = g[row.numel - 1] / all;
  return with_shares(load, expert_shares(g, row.numel));
}

RouterLoad router_load_from_counts(int layer, const double* counts, size_t experts) {
  double all = 0;
  for (size_t e = 0; e < experts; ++e) all += counts[e];
  std::vector<double> p;
  if (all > 0)
    for (size_t e = 0; e < experts; ++e) p.push_back(counts[e] / all);
  return with_shares(RouterLoad{.layer = layer}, p);
}

void balance_biases(float* params, float* m, float* v, const float* grads, const ParamLayout& layout, int64_t t,
                    const AdamWOptions& opt) {
  std::vector<ParamEntry> rows;
  for (const ParamEntry* row : balanced_rows(layout)) rows.push_back(*row);
  balance_biases(params, m, v, grads, rows, t, opt);
}

void balance_biases(float* params, float* m, float* v, const float* grads, const std::vector<ParamEntry>& rows,
                    int64_t t, const AdamWOptions& opt) {
  AdamWOptions no_decay = opt;
  no_decay.weight_decay = 0.0;
  for (const ParamEntry& r : rows) {
    const ParamEntry* row = &r;
    const std::vector<double> p = expert_shares(grads + row->offset, row->numel);
    if (p.empty()) continue;
    const size_t E = p.size();
    std::vector<float> error(E);
    for (size_t e = 0; e < E; ++e) error[e] = float(p[e] - 1.0 / double(E));
    // The E expert biases only: the skip class's bias (the last) is never stepped.
    adamw_update(params + row->offset, m + row->offset, v + row->offset, error.data(), E, t, no_decay);
  }
}

}  // namespace atl
