#include "atoll/train/task_eval.h"

#include <algorithm>

#include "atoll/core/check.h"

namespace atl {
namespace {

// The first index of the largest value (numpy's argmax).
size_t argmax(const std::vector<double>& v) { return size_t(std::max_element(v.begin(), v.end()) - v.begin()); }

}  // namespace

TaskScores score_task(const TaskSet& set, const PositionLossFn& losses, int seq_len, int batch) {
  const int T = seq_len;
  // Every ending of every item, in order: (item, ending).
  std::vector<std::pair<size_t, size_t>> order;
  TaskScores s{.name = set.name, .items = int64_t(set.items.size()), .truncated = set.truncated};
  for (size_t i = 0; i < set.items.size(); ++i) {
    s.loglik.emplace_back(set.items[i].endings.size(), 0.0);
    for (size_t e = 0; e < set.items[i].endings.size(); ++e) order.emplace_back(i, e);
  }
  std::vector<int32_t> in(size_t(batch) * T), tg(size_t(batch) * T);
  std::vector<float> loss(size_t(batch) * T);
  for (size_t at = 0; at < order.size(); at += size_t(batch)) {
    const int B = int(std::min(order.size() - at, size_t(batch)));
    std::fill(in.begin(), in.end(), 0), std::fill(tg.begin(), tg.end(), 0);  // padding: any id
    for (int b = 0; b < B; ++b) {
      const std::vector<int32_t>& t = set.items[order[at + b].first].endings[order[at + b].second].tokens;
      ATOLL_CHECK(t.size() >= 2 && t.size() <= size_t(T) + 1) << t.size() << " tokens for seq_len " << T;
      std::copy(t.begin(), t.end() - 1, in.begin() + int64_t(b) * T);
      std::copy(t.begin() + 1, t.end(), tg.begin() + int64_t(b) * T);
    }
    losses(in.data(), tg.data(), B, loss.data());
    for (int b = 0; b < B; ++b) {
      const auto [i, e] = order[at + b];
      const TaskSequence& seq = set.items[i].endings[e];
      // The ending's tokens are targets at positions n-1-k .. n-2 (n tokens, k of the ending).
      const int n = int(seq.tokens.size()), k = seq.ending_tokens;
      double ll = 0;
      for (int p = n - 1 - k; p < n - 1; ++p) ll -= double(loss[size_t(b) * T + p]);
      s.loglik[i][e] = ll;
    }
  }
  int64_t right = 0, right_norm = 0;
  for (size_t i = 0; i < set.items.size(); ++i) {
    const TaskItemTokens& item = set.items[i];
    std::vector<double> norm(item.endings.size());
    for (size_t e = 0; e < norm.size(); ++e) norm[e] = s.loglik[i][e] / double(item.endings[e].ending_bytes);
    right += argmax(s.loglik[i]) == size_t(item.label);
    right_norm += argmax(norm) == size_t(item.label);
  }
  s.acc = double(right) / double(s.items);
  s.acc_norm = double(right_norm) / double(s.items);
  return s;
}

nlohmann::json task_json(const TaskScores& s) {
  return {{"task", s.name}, {"items", s.items}, {"acc", s.acc}, {"acc_norm", s.acc_norm}, {"truncated", s.truncated}};
}

}  // namespace atl
