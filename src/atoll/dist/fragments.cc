#include "atoll/dist/fragments.h"

#include <algorithm>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"

namespace atl {

size_t FragmentPlan::size(int f) const {
  size_t s = 0;
  for (const ElementRange& r : ranges[size_t(f)]) s += r.size();
  return s;
}

FragmentPlan plan_fragments(const std::vector<TensorSpan>& tensors, size_t total, int fragments) {
  int layers = 0;
  size_t first_layer_offset = total;
  for (const TensorSpan& t : tensors)
    if (t.layer >= 0) {
      layers = std::max(layers, t.layer + 1);
      first_layer_offset = std::min(first_layer_offset, t.offset);
    }
  ATOLL_CHECK(fragments >= 1 && fragments <= std::max(layers, 1)) << fragments << " fragments of " << layers << " layers";
  FragmentPlan plan;
  plan.total = total;
  plan.ranges.resize(size_t(fragments));
  plan.tensors.resize(size_t(fragments));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpan& t = tensors[i];
    // The tensor's elements and the padding up to the next tensor (or the end of the buffer).
    const size_t end = i + 1 < tensors.size() ? tensors[i + 1].offset : total;
    ATOLL_CHECK(t.offset + t.numel <= end && (i == 0 || t.offset >= tensors[i - 1].offset))
        << "layout rows out of order at " << t.name;
    const int f = t.layer >= 0 ? t.layer % fragments : (t.offset < first_layer_offset ? 0 : fragments - 1);
    auto& r = plan.ranges[size_t(f)];
    // The first tensor also takes any elements before it, so the plan covers [0, total).
    const size_t begin = i == 0 ? 0 : t.offset;
    if (!r.empty() && r.back().end == begin)
      r.back().end = end;
    else
      r.push_back({begin, end});
    plan.tensors[size_t(f)].push_back(t.name);
  }
  if (tensors.empty()) plan.ranges[0].push_back({0, total});
  return plan;
}

FragmentPlan whole_plan(size_t n) { return plan_fragments({}, n, 1); }

FragmentSchedule::FragmentSchedule(int64_t inner_steps, int fragments) : H_(inner_steps), P_(fragments) {
  ATOLL_CHECK(H_ >= 1 && P_ >= 1 && P_ <= H_) << "H " << H_ << ", P " << P_;
}

int FragmentSchedule::due(int64_t step, int64_t last_step) const {
  if (step <= 0 || step >= last_step) return -1;
  // Offsets are distinct residues mod H (P <= H), so at most one fragment is due.
  const int64_t r = step % H_;
  for (int f = 0; f < P_; ++f)
    if (offset(f) == r && step > offset(f)) return f;
  return -1;
}

int64_t FragmentSchedule::syncs(int f, int64_t steps) const {
  if (steps <= 0) return 0;
  const int64_t room = steps - 1 - offset(f);  // regular syncs happen at offset + kH <= steps - 1
  return (room >= H_ ? room / H_ : 0) + 1;
}

void validate_streaming(const DilocoConfig& d, int n_layers) {
  const std::string P = std::to_string(d.fragments), H = std::to_string(d.inner_steps),
                    tau = std::to_string(d.overlap_steps);
  if (d.fragments > n_layers)
    throw ConfigError("diloco.fragments = " + P + " exceeds model.n_layers = " + std::to_string(n_layers) +
                      " (a fragment is a group of whole layers); fix: set diloco.fragments to at most " +
                      std::to_string(n_layers));
  if (d.fragments > d.inner_steps)
    throw ConfigError("diloco.fragments = " + P + " exceeds diloco.inner_steps = " + H +
                      " (each fragment needs its own sync step); fix: set diloco.fragments to at most " + H +
                      " or raise diloco.inner_steps");
  if (d.overlap_steps > 0 && int64_t(d.overlap_steps) * d.fragments >= d.inner_steps) {
    // The largest τ with τ·P < H.
    const int64_t max_tau = (d.inner_steps - 1) / d.fragments;
    throw ConfigError("diloco.overlap_steps = " + tau + " is not below diloco.inner_steps / diloco.fragments = " + H +
                      "/" + P + " (one fragment's exchange must end before the next one's starts); fix: set "
                      "diloco.overlap_steps to at most " + std::to_string(max_tau) +
                      (max_tau == 0 ? " (blocking), or raise diloco.inner_steps" : ", or raise diloco.inner_steps"));
  }
}

}  // namespace atl
