// ZeRO-1 inside an island (Rajbhandari et al., https://arxiv.org/abs/1910.02054; ZAYA1 trained
// with it): the island's M ranks split the inner optimizer's state, so each holds 1/M of the
// moments and steps 1/M of the parameters; the gradients are reduce-scattered onto the shards
// and the updated parameters all-gathered (engine/engine.h ZeroLink, train/island_hooks.h).
//
// The shards are contiguous runs of whole layout entries, rank r's after rank r-1's: a shard
// boundary falls at the entry boundary nearest to r/M of the buffer, so the bytes are balanced up
// to one tensor. Whole tensors because Muon orthogonalises whole matrices (an expert tensor's E
// matrices stay together too), and one rule for AdamW keeps a tensor's moments in one place
// (the checkpoint plan also deals whole tensors, ckpt/checkpoint_plan.h). Contiguous because
// then the reduce-scatter and the all-gather move one span per rank. A rank may own nothing
// when M exceeds the number of tensors.
#pragma once

#include <cstddef>
#include <vector>

#include "atoll/model/layout.h"

namespace atl {

// [lo, hi) of the flat buffers: elements whose optimizer state this rank holds and steps.
struct ZeroShard {
  size_t lo = 0, hi = 0;
  size_t size() const { return hi - lo; }
  bool contains(size_t offset) const { return offset >= lo && offset < hi; }
};

// The M shards of the layout in rank order (their sizes sum to layout.total()).
std::vector<ZeroShard> zero_shards(const ParamLayout& layout, int ranks);
std::vector<size_t> zero_shard_sizes(const ParamLayout& layout, int ranks);

}  // namespace atl
