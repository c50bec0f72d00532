// A stable sort of small integer keys on the device, for the two places that group rows by an
// id in a fixed order: embedding_backward's sorted scatter (by token) and the MoE routing (by
// expert). Stability is the point: rows with equal keys keep their original order, which is
// the order the CPU reference adds them in, so the GPU sums match it bit for bit.
#pragma once

#include <cstdint>

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// sorted_keys[n] (=) keys in ascending order; order[n] (=) the original index of each, equal
// keys by ascending index. keys must lie in [0, key_limit) (bits above key_limit's are not
// looked at). scratch holds sort_scratch_ints(n) int32. Device pointers.
//
// One block, least-significant-digit radix sort with 4-bit digits: per pass each thread counts
// the digits of its contiguous chunk, an exclusive scan in (digit, thread) order gives every
// thread its first slot per digit, and each thread places its chunk in order (so stable).
// O(n · bits(key_limit)/4) work on one SM: fine for a batch of tokens, not for millions.
void stable_sort_by_key(int32_t* sorted_keys, int32_t* order, const int32_t* keys, int n, int key_limit,
                        int32_t* scratch, cudaStream_t stream = nullptr);

inline int64_t sort_scratch_ints(int n) { return 4 * int64_t(n); }

}  // namespace atl::gpu
