// The plan of a sharded checkpoint save (ckpt/checkpoint.h): which worker writes each tensor.
// Every worker computes the same plan from the same inputs (the copies to save and who holds
// each), so nobody needs to be told what to write.
//
// A copy is one buffer of the layout saved under a kind ("param", "island1_adam_m",
// "diloco_theta"), held identically by a set of workers: an island's M ranks for its copy of a
// parameter or moment, every live worker for θ. Its layout entries are dealt out among the
// holders, largest first, each to the holder with the fewest bytes planned so far (all copies
// counted), so the bytes each worker writes are nearly equal and a copy held by M workers is
// written once, in M parts at the same time. Whole entries, never a split tensor: the manifest
// keeps indexing one tensor per name, so any number of ranks loads it.
#pragma once

#include <string>
#include <vector>

#include "atoll/model/layout.h"

namespace atl {

struct PlanCopy {
  std::string kind;
  std::vector<int> holders;  // global worker indexes, at least one
  // A copy whose entries each live on one holder only (a ZeRO-1 island's moments,
  // optim/zero_shard.h): writers[e] writes entry e, not dealt; its bytes count first. Empty:
  // dealt as above.
  std::vector<int> writers{};
};

// writer[c][e]: the global worker that writes layout entry e of copy c.
using CheckpointPlan = std::vector<std::vector<int>>;
CheckpointPlan plan_checkpoint(const std::vector<PlanCopy>& copies, const ParamLayout& layout);

}  // namespace atl
