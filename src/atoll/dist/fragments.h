// Streaming DiLoCo's fragments and their schedule (Douillard et al. 2025, "Streaming DiLoCo with
// overlapping communication", https://arxiv.org/abs/2501.18512).
//
// Fragments: the parameter layout (model/layout.h, one row per whole tensor) is cut into P groups
// of whole tensors. Layers are taken strided, as in the paper: fragment f holds blocks f, f+P,
// f+2P, ..., so every fragment samples the whole depth and fragments stay close in size even
// when P does not divide L. The tensors outside the blocks go to the ends they sit next to: the
// embedding (before the first block) to fragment 0, the final norm and the head (after the last
// block) to fragment P-1, which spreads the two largest tensors of a small-vocabulary model over
// two fragments. A tensor owns its elements and the alignment padding after it, so the
// fragments partition [0, total) exactly: with P = 1 fragment 0 is the whole flat buffer, and
// everything (ring input, θ hash) is byte for byte what unfragmented DiLoCo does.
//
// Schedule: fragment f syncs every H inner steps, staggered by offset_f = floor(f·H/P): at the
// steps t < last_step with t > offset_f and (t − offset_f) % H == 0. The last step is one
// blocking sync of every fragment, so a run always ends on θ_global everywhere. With P = 1 that
// is exactly plain DiLoCo: every H steps and at the last step. P <= H keeps every fragment's
// step distinct; an overlapped exchange (τ = overlap_steps > 0) must end before the next
// fragment's starts, which τ·P < H guarantees (consecutive offsets are at least floor(H/P)
// apart), so at most one exchange is ever in flight on the outer group. (The delayed outer step,
// outer_delay.h, keeps one per fragment in flight; they use the group one after another.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "atoll/config/config.h"

namespace atl {

// One row of the layout as the plan needs it (dist/ does not depend on model/).
struct TensorSpan {
  std::string name;
  size_t offset = 0, numel = 0;
  int layer = -1;  // block index, -1 outside the blocks
};

struct ElementRange {
  size_t begin = 0, end = 0;  // [begin, end) in the flat buffer
  size_t size() const { return end - begin; }
};

struct FragmentPlan {
  std::vector<std::vector<ElementRange>> ranges;  // per fragment: ascending, adjacent ones merged
  std::vector<std::vector<std::string>> tensors;  // per fragment: the tensor names, layout order
  size_t total = 0;

  int count() const { return int(ranges.size()); }
  size_t size(int f) const;  // elements of fragment f (padding included)
};

// Cuts [0, total) into `fragments` groups of whole tensors (see above). `tensors` in layout order
// (ascending offsets). ATOLL_CHECKs that fragments is within [1, number of blocks] (or 1 when
// there are none); user-facing checks are validate_streaming's.
FragmentPlan plan_fragments(const std::vector<TensorSpan>& tensors, size_t total, int fragments);

// One fragment covering [0, n): unfragmented DiLoCo.
FragmentPlan whole_plan(size_t n);

class FragmentSchedule {
 public:
  FragmentSchedule(int64_t inner_steps, int fragments);
  int64_t offset(int f) const { return int64_t(f) * H_ / P_; }
  // The fragment whose regular sync starts after inner step `step` (1-based), or -1. The last
  // step is never a regular sync (it is the final full sync).
  int due(int64_t step, int64_t last_step) const;
  // Outer steps fragment f takes in a run of `steps` steps: its regular syncs plus the final one.
  int64_t syncs(int f, int64_t steps) const;

 private:
  int64_t H_;
  int P_;
};

// The user-facing checks of diloco.fragments and diloco.overlap_steps against the model; throws
// ConfigError naming the keys and the fix.
void validate_streaming(const DilocoConfig& d, int n_layers);

}  // namespace atl
