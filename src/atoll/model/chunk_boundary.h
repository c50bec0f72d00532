// The boundary exchange of context parallelism (docs/long_context.md): a part that reads the
// tokens before its own (CCA's convolutions and value shift: boundary_tokens, model/part_kinds.h)
// needs, for each chunk a rank holds, the last rows of the chunk before it.
//
// Under the zigzag layout (model/ring_attention.h) rank r holds chunks r and 2P-1-r. Chunk r's
// predecessor r-1 is rank r-1's first chunk; chunk 2P-1-r's predecessor 2P-2-r is rank r+1's
// second, or, for rank P-1, its own first (its chunks P-1 and P are adjacent). So every message
// goes between neighbours r and r+1, one each way, at once (Collective::exchange): r sends its
// first chunk's tail right and its second chunk's tail left. Backward is the same messages
// reversed: the gradient of a head goes back to the tail it was.
//
// The config refuses chunks shorter than boundary_tokens (config/context_parallel.h), so the rows
// a chunk reads all lie in the one chunk before it: a tail is a chunk's own last rows.
#pragma once

#include <cstddef>

#include "atoll/core/collective.h"

namespace atl {

// Forward: head0, head1 [n] (=) the tails of the chunks before this rank's first and second
// chunk, from their holders' tail0/tail1 [n]. Rank 0's first chunk starts the sequence: head0
// is left as it is. Every rank of `group` calls it together.
template <typename T>
void chunk_tails_forward(T* head0, T* head1, const T* tail0, const T* tail1, size_t n, Collective& group);

// Backward: dtail0, dtail1 [n] (=) the gradients that the holders of the chunks after this
// rank's first and second chunk computed for their heads (dhead0, dhead1 [n] there). Rank 0's
// second chunk ends the sequence: its dtail1 is 0. dhead0 is not read on rank 0.
template <typename T>
void chunk_heads_backward(T* dtail0, T* dtail1, const T* dhead0, const T* dhead1, size_t n, Collective& group);

}  // namespace atl
