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
// it holds. The work is the single-process blocked kernel's (backend/cpu/attention.h): tiles of
// 64 query rows of one head against a key chunk of the block, scores and weighted values as
// BLAS products (backend/cpu/gemm.h), merged into a running max and sum per query row (flash
// attention's online softmax), which is the log-sum-exp merge of the blocks' partial outputs. A
// (query chunk, key chunk) pair is skipped when the key chunk lies after the query chunk, taken
// whole when before, causally when they are the same chunk. No score matrix larger than one
// [64, chunk] tile per thread exists.
//
// Backward: the second ring carries each block's keys and values, and separately the sums of
// their gradients dK, dV: every rank computes its queries' contribution to the block it holds
// (tiles again, recomputed from the forward's log-sum-exp), adds it to the sums that arrived
// for that block and passes them on, one step behind the keys and values; after P steps each
// block's sums are home. Both transfers are in flight while the next block is computed. dQ
// stays local. Every gradient row has one writer (tasks own a key/value head), so the results
// do not depend on the thread count.
//
// Bench-only switches (environment, read once per process; docs/long_context.md):
// ATOLL_CP_LAYOUT=plain gives rank r the contiguous chunks 2r and 2r+1 instead of the zigzag
// pair (context_layout), to measure what the zigzag layout buys; ATOLL_RING_OVERLAP=0 waits for
// each transfer before computing, to measure how long the transfers take (ring_clock);
// ATOLL_RING_SYNC=1 meets the neighbours before each transfer, so that a slower peer's lateness
// is counted apart (RingClock::sync_s) from the transfer's wait.
//
// tests/dist/ring_attention_test.cc checks output, log-sum-exp, dQ, dK and dV against the
// single-process kernel over real processes, P in {1, 2, 3, 4}, T not divisible by P, GQA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "atoll/core/collective.h"
#include "atoll/model/part.h"

namespace atl {

// The zigzag split of sequences of T tokens over P ranks (contiguous: the plain split, rank r
// holding chunks 2r and 2r+1, for benchmarks only).
struct ZigzagLayout {
  int T = 0, P = 1;
  bool contiguous = false;
  int chunk_begin(int c) const { return int(int64_t(T) * c / (2 * P)); }
  int chunk_len(int c) const { return chunk_begin(c + 1) - chunk_begin(c); }
  int first_chunk(int r) const { return contiguous ? 2 * r : r; }
  int second_chunk(int r) const { return contiguous ? 2 * r + 1 : 2 * P - 1 - r; }
  int local_len(int r) const { return chunk_len(first_chunk(r)) + chunk_len(second_chunk(r)); }
  // Rank r's tokens as the parts see them (PartContext::pos).
  TokenPositions positions(int r) const {
    return {.runs = 2,
            .start = {chunk_begin(first_chunk(r)), chunk_begin(second_chunk(r))},
            .len = {chunk_len(first_chunk(r)), chunk_len(second_chunk(r))}};
  }
};

// The layout a run uses: zigzag, or plain under ATOLL_CP_LAYOUT=plain (bench only; any other
// value than "zigzag" or "plain" is a ConfigError naming the variable and the fix).
ZigzagLayout context_layout(int T, int P);

// This process's time in ring attention so far (forward and backward, cumulative): seconds
// computing blocks, and seconds blocked waiting for a ring transfer to finish. With the
// overlap, the wait is the part of the transfers (and of a slower peer's compute) that the
// computation did not hide; under ATOLL_RING_OVERLAP=0 it is the transfers' whole time.
// Under ATOLL_RING_SYNC=1 (bench only) every transfer starts with a one-byte exchange with the
// neighbours, waited for and counted as sync_s: a slower peer's lateness shows there, so the
// wait is the transfer's own unhidden time (zero without the switch).
struct RingClock {
  double compute_s = 0, wait_s = 0, sync_s = 0;
};
RingClock ring_clock();

// Step s (0 <= s < P) of a ring at rank r: the block in hand is rank src's (Tk rows a sequence),
// the one arriving is its predecessor's (Tn rows); blocks go to rank `to`, come from `from`.
// The device mirror of the ring (model/device_ring_attention.h) walks these steps.
struct RingStep {
  int src, Tk, Tn, to, from;
  static RingStep at(const ZigzagLayout& z, int r, int s) {
    const int P = z.P, src = (r - s + P) % P;
    return {src, z.local_len(src), z.local_len((src - 1 + P) % P), (r + 1) % P, (r - 1 + P) % P};
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
// The last transfer, each block's dK/dV sums going home to their owner, has no attention work
// left to hide behind: `dq_ready` (if given) runs while it travels, with dq final and dk, dv not
// yet written: the caller's work that needs only dq (its projection's backward) hides it.
template <typename T>
void ring_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                             const T* v, const RingDims& d, const ZigzagLayout& z, Collective& group,
                             const std::function<void()>& dq_ready = {});

}  // namespace atl
