// The tiled attention kernels shared by attention.cu (causal attention over whole sequences) and
// ring_attention.cu (its steps over zigzag chunks, context parallelism). Device side; included
// by those two files only (each gets its own copy of the kernels: anonymous namespace).
//
// Flash-style (Dao et al., https://arxiv.org/abs/2205.14135) in its plainest form: one block of
// threads per query row walks the keys it sees in tiles of the block's width with an online
// softmax (running max m and sum l, the partial output rescaled by exp(m_old − m_new) per tile),
// so no score matrix is stored; the backward recomputes P from lse, one block per query row for
// dq and one per key row for dk and dv, so no atomics and deterministic results.
//
// Which keys a query row sees: rows belong to chunks of the sequence (RingChunks, two per side;
// whole-sequence attention is one chunk of T rows and an empty one). Query row t of chunk a sees
// key row s of chunk b when b < a, or b == a and s <= t.
#pragma once

#include <cmath>

#include "atoll/backend/cuda/common.cuh"
#include "atoll/core/check.h"
#include "atoll/backend/cuda/ring_attention.h"

namespace atl::gpu {
namespace {

constexpr int kAttnThreads = 128;  // keys (or queries) per tile; a power of two for block_sum

__device__ inline size_t row_of(int b, int t, int heads, int h, int T_, int HD) {
  return ((size_t(b) * T_ + t) * heads + h) * HD;
}

__device__ inline float dot(const float* a, const float* b, int n) {
  float acc = 0.f;
  for (int i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// Local row t of one side's rows: its chunk's id and its row in the chunk.
__device__ inline void chunk_row(const RingChunks& c, int t, int* id, int* row) {
  if (t < c.len[0]) *id = c.id[0], *row = t;
  else *id = c.id[1], *row = t - c.len[0];
}

// The keys that query row `row` of chunk `qid` sees, as one list: n0 from the keys' chunk 0
// (local rows [0, n0)), then those of chunk 1 (local rows len[0] + [0, n - n0)).
struct Visible {
  int n0, n, skip;  // skip: where the second run starts among the local rows, minus n0
  __device__ int key(int i) const { return i < n0 ? i : i + skip; }
};
__device__ inline Visible visible_keys(const RingChunks& kc, int qid, int row) {
  int lim[2];
  for (int c = 0; c < 2; ++c) lim[c] = kc.id[c] > qid ? 0 : (kc.id[c] == qid ? row + 1 : kc.len[c]);
  return {lim[0], lim[0] + lim[1], kc.len[0] - lim[0]};
}

// The query row that a block of the forward and dq kernels works on, (t, h, b) from the grid:
// its key head, its rows of q/out/dout [B,Tq,NH,HD] and of lse/D [B,NH,Tq], and the keys it sees.
struct QueryRow {
  int t, h, b, kh;
  size_t qi, li;
  Visible vis;
};
__device__ inline QueryRow query_row(const RingChunks& qc, const RingChunks& kc, int Tq, int NH, int NKV, int HD) {
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int qid, qrow;
  chunk_row(qc, t, &qid, &qrow);
  return {t, h, b, h / (NH / NKV), row_of(b, t, NH, h, Tq, HD), (size_t(b) * NH + h) * Tq + t,
          visible_keys(kc, qid, qrow)};
}

// The query rows that see key row `row` of chunk `kid`: rows [first, len) of each query chunk,
// as one list of n rows (n0 from chunk 0).
struct Seeing {
  int n0, n, first0, first1, len0;
  __device__ int query(int i) const { return i < n0 ? first0 + i : len0 + first1 + (i - n0); }
};
__device__ inline Seeing seeing_queries(const RingChunks& qc, int kid, int row) {
  int first[2], cnt[2];
  for (int c = 0; c < 2; ++c) {
    first[c] = kid == qc.id[c] ? row : 0;
    cnt[c] = kid > qc.id[c] ? 0 : qc.len[c] - first[c];
  }
  return {cnt[0], cnt[0] + cnt[1], first[0], first[1], qc.len[0]};
}

// Block (t, h, b): query row t of head h merges the keys it sees into its state: acc[B,Tq,NH,HD]
// (the unnormalised output), m and l [B,NH,Tq]. fresh: the state starts empty instead of being
// read; finish: acc and m are written as out = acc/l and lse = m + log l (l is not touched)
// instead of as the state. Shared: q[HD], acc[HD], p[tile], reduction buffer[tile].
__global__ void __launch_bounds__(kAttnThreads)
    attention_tile_forward_kernel(float* acc, float* m, float* l, const float* q, int Tq, RingChunks qc,
                                  const float* k, const float* v, int Tk, RingChunks kc, int NH, int NKV, int HD,
                                  float scale, bool fresh, bool finish) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* os = qs + HD;
  float* ps = os + HD;
  float* red = ps + kAttnThreads;
  const int tid = threadIdx.x;
  const auto [t, h, b, kh, qi, li, vis] = query_row(qc, kc, Tq, NH, NKV, HD);
  if (vis.n == 0) return;  // the whole block: n is the same in every thread
  for (int d = tid; d < HD; d += kAttnThreads) {
    qs[d] = q[qi + d];
    os[d] = fresh ? 0.f : acc[qi + d];
  }
  __syncthreads();
  float mr = fresh ? -INFINITY : m[li], lr = fresh ? 0.f : l[li];  // the same in every thread
  for (int s0 = 0; s0 < vis.n; s0 += kAttnThreads) {
    const int s = s0 + tid;
    const float score = s < vis.n ? dot(qs, k + row_of(b, vis.key(s), NKV, kh, Tk, HD), HD) * scale : -INFINITY;
    const float m_new = fmaxf(mr, block_max(score, red));  // finite: the tile's first key is visible
    const float p = s < vis.n ? expf(score - m_new) : 0.f;
    ps[tid] = p;
    const float tile_sum = block_sum(p, red);  // its barriers also publish ps
    const float corr = expf(mr - m_new);       // 0 while the state is empty (m = -inf)
    lr = lr * corr + tile_sum;
    const int count = min(kAttnThreads, vis.n - s0);
    for (int d = tid; d < HD; d += kAttnThreads) {
      float a = os[d] * corr;
      for (int j = 0; j < count; ++j) a += ps[j] * v[row_of(b, vis.key(s0 + j), NKV, kh, Tk, HD) + d];
      os[d] = a;
    }
    __syncthreads();  // ps is rewritten by the next tile
    mr = m_new;
  }
  const float inv = finish ? 1.f / lr : 1.f;
  for (int d = tid; d < HD; d += kAttnThreads) acc[qi + d] = os[d] * inv;
  if (tid != 0) return;
  if (finish) m[li] = mr + logf(lr);
  else m[li] = mr, l[li] = lr;
}

// Block (t, h, b): dq of query row t over the keys it sees, (+=) when accumulate, else (=). P is
// recomputed from lse, dS from D = dout·out. Shared: q, dout, dq [HD]; ds [tile].
__global__ void __launch_bounds__(kAttnThreads)
    attention_tile_dq_kernel(float* dq, const float* dout, const float* Dbuf, const float* lse, const float* q, int Tq,
                             RingChunks qc, const float* k, const float* v, int Tk, RingChunks kc, int NH, int NKV,
                             int HD, float scale, bool accumulate) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* dos = qs + HD;
  float* dqs = dos + HD;
  float* dss = dqs + HD;
  const int tid = threadIdx.x;
  const auto [t, h, b, kh, qi, li, vis] = query_row(qc, kc, Tq, NH, NKV, HD);
  if (vis.n == 0) {
    for (int d = tid; d < HD && !accumulate; d += kAttnThreads) dq[qi + d] = 0.f;
    return;
  }
  for (int d = tid; d < HD; d += kAttnThreads) {
    qs[d] = q[qi + d];
    dos[d] = dout[qi + d];
    dqs[d] = accumulate ? dq[qi + d] : 0.f;
  }
  __syncthreads();
  const float D = Dbuf[li], L = lse[li];
  for (int s0 = 0; s0 < vis.n; s0 += kAttnThreads) {
    const int s = s0 + tid;
    float ds = 0.f;
    if (s < vis.n) {
      const size_t ki = row_of(b, vis.key(s), NKV, kh, Tk, HD);
      const float p = expf(dot(qs, k + ki, HD) * scale - L);
      ds = p * (dot(dos, v + ki, HD) - D) * scale;
    }
    dss[tid] = ds;
    __syncthreads();
    const int count = min(kAttnThreads, vis.n - s0);
    for (int d = tid; d < HD; d += kAttnThreads) {
      float a = dqs[d];
      for (int j = 0; j < count; ++j) a += dss[j] * k[row_of(b, vis.key(s0 + j), NKV, kh, Tk, HD) + d];
      dqs[d] = a;
    }
    __syncthreads();
  }
  for (int d = tid; d < HD; d += kAttnThreads) dq[qi + d] = dqs[d];
}

// Block (s, kh, b): dk and dv of key row s, summed over the query heads of key head kh and the
// query rows that see it, (+=) when accumulate, else (=). Shared: k, v, dk, dv [HD]; p, ds [tile].
__global__ void __launch_bounds__(kAttnThreads)
    attention_tile_dkdv_kernel(float* dk, float* dv, const float* dout, const float* Dbuf, const float* lse,
                               const float* q, int Tq, RingChunks qc, const float* k, const float* v, int Tk,
                               RingChunks kc, int NH, int NKV, int HD, float scale, bool accumulate) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = ks + HD;
  float* dks = vs + HD;
  float* dvs = dks + HD;
  float* pss = dvs + HD;
  float* dss = pss + kAttnThreads;
  const int s = blockIdx.x, kh = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  int kid, krow;
  chunk_row(kc, s, &kid, &krow);
  const Seeing see = seeing_queries(qc, kid, krow);
  const int group = NH / NKV;
  const size_t ki = row_of(b, s, NKV, kh, Tk, HD);
  if (see.n == 0) {
    for (int d = tid; d < HD && !accumulate; d += kAttnThreads) dk[ki + d] = dv[ki + d] = 0.f;
    return;
  }
  for (int d = tid; d < HD; d += kAttnThreads) {
    ks[d] = k[ki + d];
    vs[d] = v[ki + d];
    dks[d] = accumulate ? dk[ki + d] : 0.f;
    dvs[d] = accumulate ? dv[ki + d] : 0.f;
  }
  __syncthreads();
  for (int h = kh * group; h < (kh + 1) * group; ++h) {
    for (int i0 = 0; i0 < see.n; i0 += kAttnThreads) {
      const int i = i0 + tid;
      float p = 0.f, ds = 0.f;
      if (i < see.n) {
        const int t = see.query(i);
        const size_t qi = row_of(b, t, NH, h, Tq, HD), li = (size_t(b) * NH + h) * Tq + t;
        p = expf(dot(q + qi, ks, HD) * scale - lse[li]);
        ds = p * (dot(dout + qi, vs, HD) - Dbuf[li]) * scale;
      }
      pss[tid] = p;
      dss[tid] = ds;
      __syncthreads();
      const int count = min(kAttnThreads, see.n - i0);
      for (int d = tid; d < HD; d += kAttnThreads) {
        float ak = dks[d], av = dvs[d];
        for (int j = 0; j < count; ++j) {
          const size_t qj = row_of(b, see.query(i0 + j), NH, h, Tq, HD) + d;
          ak += dss[j] * q[qj];
          av += pss[j] * dout[qj];
        }
        dks[d] = ak;
        dvs[d] = av;
      }
      __syncthreads();
    }
  }
  for (int d = tid; d < HD; d += kAttnThreads) {
    dk[ki + d] = dks[d];
    dv[ki + d] = dvs[d];
  }
}

// D[B,NH,Tq] (=) = Σ_e dout[b,t,h,e] · out[b,t,h,e]; one thread per (b, t, h) row.
__global__ void attention_row_dot_kernel(float* D, const float* dout, const float* out, int Tq, int NH, int HD,
                                         size_t rows) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  const int h = int(i % NH), t = int((i / NH) % Tq), b = int(i / (size_t(NH) * Tq));
  D[(size_t(b) * NH + h) * Tq + t] = dot(dout + i * HD, out + i * HD, HD);
}

// Host side: the shapes the kernels accept (CheckError otherwise) and the softmax scale.
inline void check_attention_shape(int B, int Tq, int Tk, int NH, int NKV, int HD) {
  ATOLL_CHECK(B >= 0 && Tq >= 0 && Tk >= 0 && HD > 0 && NKV > 0 && NH % NKV == 0)
      << "attention B=" << B << " Tq=" << Tq << " Tk=" << Tk << " NH=" << NH << " NKV=" << NKV << " HD=" << HD;
  ATOLL_CHECK(NH <= 65535 && B <= 65535) << "grid limits: NH " << NH << " B " << B;
}
inline float attention_scale(int HD) { return float(1.0 / std::sqrt(double(HD))); }

inline size_t forward_smem(int HD) { return (2 * size_t(HD) + 2 * kAttnThreads) * sizeof(float); }
inline size_t dq_smem(int HD) { return (3 * size_t(HD) + kAttnThreads) * sizeof(float); }
inline size_t dkdv_smem(int HD) { return (4 * size_t(HD) + 2 * kAttnThreads) * sizeof(float); }

}  // namespace
}  // namespace atl::gpu
