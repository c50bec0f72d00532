// Ring attention (context parallelism): causal GQA over sequences split across the P ranks of a
// group, exact against attention over the whole sequence on one process.
//
// Layout (zigzag, as ring-flash-attention's): each sequence of T tokens is cut into 2P chunks,
// chunk c = [⌊cT/2P⌋, ⌊(c+1)T/2P⌋) (T need not divide; a chunk may be empty), and rank r holds
// chunks r and 2P-1-r, in that order, as its local T_r tokens [B, T_r, ...]. Under the causal
// mask every rank then has about the same work: an early chunk sees few keys, its partner many.
//
// Forward: the ranks pass their key/value blocks round the ring (rank r sends to r+1 and
// receives from r-1, P-1 times); while a block moves, each rank attends its queries to the block
// it holds, streaming over key tiles with a running max and sum per query row (flash attention's
// online softmax), which merges the blocks' partial outputs by log-sum-exp. A pair of chunks is
// skipped when the key chunk lies after the query chunk, attended in full when before, and
// causally when they are the same chunk. No score matrix larger than one row per thread exists.
//
// Backward: the second ring carries each key/value block together with its gradients dK, dV:
// every rank adds its queries' contributions to the block it holds and passes it on; after P
// steps each block is home with the sum over every rank's queries. dQ stays local. Gradients
// are recomputed from the forward's log-sum-exp, as the blocked kernel (backend/cpu/attention.h).
//
// tests/dist/ring_attention_test.cc checks output, log-sum-exp, dQ, dK and dV against the
// single-process kernel over real processes, P in {1, 2, 3, 4}, T not divisible by P, GQA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "atoll/core/collective.h"
#include "atoll/model/part.h"

namespace atl {

// The zigzag split of sequences of T tokens over P ranks.
struct ZigzagLayout {
  int T = 0, P = 1;
  int chunk_begin(int c) const { return int(int64_t(T) * c / (2 * P)); }
  int chunk_len(int c) const { return chunk_begin(c + 1) - chunk_begin(c); }
  int first_chunk(int r) const { return r; }
  int second_chunk(int r) const { return 2 * P - 1 - r; }
  int local_len(int r) const { return chunk_len(first_chunk(r)) + chunk_len(second_chunk(r)); }
  // Rank r's tokens as the parts see them (PartContext::pos).
  TokenPositions positions(int r) const {
    return {.runs = 2,
            .start = {chunk_begin(first_chunk(r)), chunk_begin(second_chunk(r))},
            .len = {chunk_len(first_chunk(r)), chunk_len(second_chunk(r))}};
  }
};

// local[B, T_r, W] (=) rank r's rows of whole[B, T, W], in its chunks' order; and back.
template <typename X>
void zigzag_take(X* local, const X* whole, int B, size_t W, const ZigzagLayout& z, int r);
template <typename X>
void zigzag_put(X* whole, const X* local, int B, size_t W, const ZigzagLayout& z, int r);

// Scale 1/sqrt(HD); NKV divides NH (query head h reads key/value head h / (NH/NKV)).
struct RingDims {
  int B, NH, NKV, HD;
};

// out[B,T_r,NH,HD] (=), lse[B,NH,T_r] (=) for this rank's queries q[B,T_r,NH,HD] over every
// rank's keys and values (k, v [B,T_r,NKV,HD] here); every rank of `group` calls it together
// (group.size() == z.P, group.rank() is r). A lone rank (P = 1) computes causal attention.
template <typename T>
void ring_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const RingDims& d,
                            const ZigzagLayout& z, Collective& group);

// dq[B,T_r,NH,HD], dk, dv[B,T_r,NKV,HD] (all =) from dout, with out and lse as forward gave them.
template <typename T>
void ring_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                             const T* v, const RingDims& d, const ZigzagLayout& z, Collective& group);

}  // namespace atl
