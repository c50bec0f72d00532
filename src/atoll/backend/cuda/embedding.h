// Token embedding on the device; semantics of layers/embedding.h. Device pointers.
// Ids are not checked here (a kernel cannot throw) and must lie in [0, V): the forward pass
// writes a zero row for any other id and the atomic backward skips it, but the sorted backward
// sorts by the bits below V only, so a bad id there leaves the sums undefined. check_ids
// (arena.h) checks ids with one synchronisation where they come from outside.
#pragma once

#include <cstdint>

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// out[N,C] (=) rows of wte[V,C].
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C, int V,
                       cudaStream_t stream = nullptr);

enum class Scatter {
  kAtomic,  // atomicAdd per element: fastest, but repeated tokens add in an arbitrary order
  kSorted,  // positions stably sorted by token, each row summed in position order: the CPU's
            // order, so the result is bit-identical to layers/embedding.cc
};

// dwte[V,C] (+=) the rows of dout[N,C] at their tokens. kSorted needs scratch of
// embedding_scratch_ints(N) int32 (ignored for kAtomic).
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C, int V, Scatter scatter,
                        int32_t* scratch, cudaStream_t stream = nullptr);

int64_t embedding_scratch_ints(int N);

}  // namespace atl::gpu
