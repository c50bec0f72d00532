// The steps of ring attention on the device (context parallelism; the ring itself, which moves
// the blocks between ranks, is model/device_ring_attention.h, the mirror of the CPU's
// model/ring_attention.h). Scale 1/sqrt(HD); NH query heads share NKV key/value heads.
//
// A rank holds two chunks of each sequence (zigzag), and so does every key/value block that
// reaches it: RingChunks says which chunks of the 2P (their ids, in sequence order) and how long
// they are; a rank's local rows are chunk 0's rows then chunk 1's. Query row t of chunk a sees
// key row s of chunk b when b < a, or b == a and s <= t (the causal mask across chunks).
//
// Forward: one step attends this rank's queries to one key/value block and merges the result
// into a running state per query row (flash attention's online softmax: running max m, sum l
// and unnormalised output acc), so the blocks' partial outputs merge by log-sum-exp in any
// order; ring_forward_start sets the state empty, ring_forward_finish turns it into out and lse.
// Backward: from lse, D = rowsum(dout ∘ out) and one key/value block, a step adds the block's
// share of dq, and this rank's queries' share of the block's dk and dv. The kernels are
// attention.h's (attention_tiles.cuh: one block per query row or key row, keys in tiles of 128,
// no atomics, so deterministic) with two chunks a side.
#pragma once

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// Two chunks of 2P: ids id[0] < id[1] or not (the zigzag pairs r with 2P-1-r), lengths len[].
struct RingChunks {
  int id[2] = {0, 0};
  int len[2] = {0, 0};
  int rows() const { return len[0] + len[1]; }
};

// acc[B,Tq,NH,HD] = 0, m[B,NH,Tq] = -inf, l[B,NH,Tq] = 0.
void ring_forward_start(float* acc, float* m, float* l, int B, int Tq, int NH, int HD, cudaStream_t stream = nullptr);

// The state of this rank's queries q[B,Tq,NH,HD] (chunks qc) merged with what they see of the
// block k, v [B,Tk,NKV,HD] (chunks kc): acc, m, l updated in place.
void ring_forward_step(float* acc, float* m, float* l, const float* q, int Tq, const RingChunks& qc, const float* k,
                       const float* v, int Tk, const RingChunks& kc, int B, int NH, int NKV, int HD,
                       cudaStream_t stream = nullptr);

// out = acc / l in place (acc becomes out), lse = m + log l in place (m becomes lse). Every row
// must have seen a key (its own, at least).
void ring_forward_finish(float* out, float* lse, const float* l, int B, int Tq, int NH, int HD,
                         cudaStream_t stream = nullptr);

// D[B,NH,Tq] (=) = Σ_e dout[b,t,h,e] · out[b,t,h,e].
void ring_row_dot(float* D, const float* dout, const float* out, int B, int Tq, int NH, int HD,
                  cudaStream_t stream = nullptr);

// dq[B,Tq,NH,HD] (+=) over the block's keys; dk, dv [B,Tk,NKV,HD] (+=) over this rank's queries.
// P and dS are recomputed from lse and D (as attention_backward).
void ring_backward_step(float* dq, float* dk, float* dv, const float* dout, const float* D, const float* lse,
                        const float* q, int Tq, const RingChunks& qc, const float* k, const float* v, int Tk,
                        const RingChunks& kc, int B, int NH, int NKV, int HD, cudaStream_t stream = nullptr);

}  // namespace atl::gpu
