// Causal grouped-query attention on the device; semantics of layers/attention.h (scale
// 1/sqrt(HD), NH query heads sharing NKV key/value heads). Device pointers.
//
// Flash-style (Dao et al., https://arxiv.org/abs/2205.14135) in its plainest form: one block
// per query row walks the keys in tiles of the block's width with an online softmax (running
// max m and sum l, the partial output rescaled by exp(m_old − m_new) per tile), so the T×T
// matrix is never stored; the forward keeps lse = m + log l per row, and the backward
// recomputes P from it. Written for correctness: no tensor cores, no K/V reuse across rows.
// The kernels (attention_tiles.cuh) are ring attention's too (ring_attention.h), with every
// sequence here one chunk.
#pragma once

#include <cstdint>

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// out[B,T,NH,HD] (=), lse[B,NH,T] (=). q[B,T,NH,HD], k/v[B,T,NKV,HD].
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int B, int T_, int NH,
                       int NKV, int HD, cudaStream_t stream = nullptr);

// dq[B,T,NH,HD], dk/dv[B,T,NKV,HD] (all =). scratch: attention_scratch_floats(B, T, NH) floats
// (D_t = dout_t · out_t per query row, its own kernel first). Then two kernels, neither with
// atomics: one block per query row for dq, one per key row for dk and dv (over the key head's
// NH/NKV query heads), so the result is deterministic.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, int B, int T_, int NH, int NKV, int HD,
                        float* scratch, cudaStream_t stream = nullptr);

inline int64_t attention_scratch_floats(int B, int T_, int NH) { return int64_t(B) * NH * T_; }

}  // namespace atl::gpu
