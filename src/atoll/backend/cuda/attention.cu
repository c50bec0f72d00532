#include "atoll/backend/cuda/attention.h"

#include <cmath>

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"
#include "atoll/core/check.h"

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

// Block (t, h, b): query row t of head h. Shared: q[HD], o[HD], p[tile], reduction buffer[tile].
__global__ void __launch_bounds__(kAttnThreads)
    attention_forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v, int T_, int NH,
                             int NKV, int HD, float scale) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* os = qs + HD;
  float* ps = os + HD;
  float* red = ps + kAttnThreads;
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int kh = h / (NH / NKV);
  const size_t qi = row_of(b, t, NH, h, T_, HD);
  for (int d = tid; d < HD; d += kAttnThreads) {
    qs[d] = q[qi + d];
    os[d] = 0.f;
  }
  __syncthreads();
  float m = -INFINITY, l = 0.f;  // identical in every thread: computed from block-wide results
  for (int s0 = 0; s0 <= t; s0 += kAttnThreads) {
    const int s = s0 + tid;
    const float score = s <= t ? dot(qs, k + row_of(b, s, NKV, kh, T_, HD), HD) * scale : -INFINITY;
    const float m_new = fmaxf(m, block_max(score, red));  // finite: key s0 <= t is in every tile
    const float p = s <= t ? expf(score - m_new) : 0.f;
    ps[tid] = p;
    const float tile_sum = block_sum(p, red);  // its barriers also publish ps
    const float corr = expf(m - m_new);        // 0 on the first tile (m = -inf)
    l = l * corr + tile_sum;
    const int count = min(kAttnThreads, t + 1 - s0);
    for (int d = tid; d < HD; d += kAttnThreads) {
      float acc = os[d] * corr;
      for (int j = 0; j < count; ++j) acc += ps[j] * v[row_of(b, s0 + j, NKV, kh, T_, HD) + d];
      os[d] = acc;
    }
    __syncthreads();  // ps is rewritten by the next tile
    m = m_new;
  }
  const float inv = 1.f / l;
  for (int d = tid; d < HD; d += kAttnThreads) out[qi + d] = os[d] * inv;
  if (tid == 0) lse[(size_t(b) * NH + h) * T_ + t] = m + logf(l);
}

// Block (t, h, b): dq of query row t. P recomputed from lse; D_t = dout_t · out_t is also
// written to Dbuf for the dk/dv kernel. Shared: q, dout, dq [HD]; ds, reduction buffer [tile].
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dq_kernel(float* dq, float* Dbuf, const float* dout, const float* out, const float* lse,
                                 const float* q, const float* k, const float* v, int T_, int NH, int NKV, int HD,
                                 float scale) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* dos = qs + HD;
  float* dqs = dos + HD;
  float* dss = dqs + HD;
  float* red = dss + kAttnThreads;
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int kh = h / (NH / NKV);
  const size_t qi = row_of(b, t, NH, h, T_, HD);
  float part = 0.f;
  for (int d = tid; d < HD; d += kAttnThreads) {
    qs[d] = q[qi + d];
    dos[d] = dout[qi + d];
    dqs[d] = 0.f;
    part += dos[d] * out[qi + d];
  }
  const float D = block_sum(part, red);  // barriers also publish qs, dos
  const size_t li = (size_t(b) * NH + h) * T_ + t;
  if (tid == 0) Dbuf[li] = D;
  const float l = lse[li];
  for (int s0 = 0; s0 <= t; s0 += kAttnThreads) {
    const int s = s0 + tid;
    float ds = 0.f;
    if (s <= t) {
      const size_t ki = row_of(b, s, NKV, kh, T_, HD);
      const float p = expf(dot(qs, k + ki, HD) * scale - l);
      ds = p * (dot(dos, v + ki, HD) - D) * scale;
    }
    dss[tid] = ds;
    __syncthreads();
    const int count = min(kAttnThreads, t + 1 - s0);
    for (int d = tid; d < HD; d += kAttnThreads) {
      float acc = dqs[d];
      for (int j = 0; j < count; ++j) acc += dss[j] * k[row_of(b, s0 + j, NKV, kh, T_, HD) + d];
      dqs[d] = acc;
    }
    __syncthreads();
  }
  for (int d = tid; d < HD; d += kAttnThreads) dq[qi + d] = dqs[d];
}

// Block (s, kh, b): dk and dv of key row s, summed over the query heads of key head kh and
// the queries t >= s. Shared: k, v, dk, dv [HD]; p, ds [tile].
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dkdv_kernel(float* dk, float* dv, const float* Dbuf, const float* dout, const float* lse,
                                   const float* q, const float* k, const float* v, int T_, int NH, int NKV, int HD,
                                   float scale) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = ks + HD;
  float* dks = vs + HD;
  float* dvs = dks + HD;
  float* pss = dvs + HD;
  float* dss = pss + kAttnThreads;
  const int s = blockIdx.x, kh = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int group = NH / NKV;
  const size_t ki = row_of(b, s, NKV, kh, T_, HD);
  for (int d = tid; d < HD; d += kAttnThreads) {
    ks[d] = k[ki + d];
    vs[d] = v[ki + d];
    dks[d] = dvs[d] = 0.f;
  }
  __syncthreads();
  for (int h = kh * group; h < (kh + 1) * group; ++h) {
    for (int t0 = s; t0 < T_; t0 += kAttnThreads) {
      const int t = t0 + tid;
      float p = 0.f, ds = 0.f;
      if (t < T_) {
        const size_t qi = row_of(b, t, NH, h, T_, HD);
        const size_t li = (size_t(b) * NH + h) * T_ + t;
        p = expf(dot(q + qi, ks, HD) * scale - lse[li]);
        ds = p * (dot(dout + qi, vs, HD) - Dbuf[li]) * scale;
      }
      pss[tid] = p;
      dss[tid] = ds;
      __syncthreads();
      const int count = min(kAttnThreads, T_ - t0);
      for (int d = tid; d < HD; d += kAttnThreads) {
        float ak = dks[d], av = dvs[d];
        for (int j = 0; j < count; ++j) {
          const size_t qj = row_of(b, t0 + j, NH, h, T_, HD) + d;
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

void check_shape(int B, int T_, int NH, int NKV, int HD) {
  ATOLL_CHECK(B >= 0 && T_ >= 0 && HD > 0 && NKV > 0 && NH % NKV == 0)
      << "attention B=" << B << " T=" << T_ << " NH=" << NH << " NKV=" << NKV << " HD=" << HD;
  ATOLL_CHECK(NH <= 65535 && B <= 65535) << "grid limits: NH " << NH << " B " << B;
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int B, int T_, int NH,
                       int NKV, int HD, cudaStream_t stream) {
  check_shape(B, T_, NH, NKV, HD);
  if (B == 0 || T_ == 0 || NH == 0) return;
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const size_t smem = (2 * size_t(HD) + 2 * kAttnThreads) * sizeof(float);
  attention_forward_kernel<<<dim3(T_, NH, B), kAttnThreads, smem, stream>>>(out, lse, q, k, v, T_, NH, NKV, HD, scale);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, int B, int T_, int NH, int NKV, int HD,
                        float* scratch, cudaStream_t stream) {
  check_shape(B, T_, NH, NKV, HD);
  if (B == 0 || T_ == 0 || NH == 0) return;
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const size_t smem_dq = (3 * size_t(HD) + 2 * kAttnThreads) * sizeof(float);
  attention_backward_dq_kernel<<<dim3(T_, NH, B), kAttnThreads, smem_dq, stream>>>(dq, scratch, dout, out, lse, q, k, v,
                                                                                   T_, NH, NKV, HD, scale);
  ATOLL_CUDA_CHECK_LAUNCH();
  const size_t smem_kv = (4 * size_t(HD) + 2 * kAttnThreads) * sizeof(float);
  attention_backward_dkdv_kernel<<<dim3(T_, NKV, B), kAttnThreads, smem_kv, stream>>>(dk, dv, scratch, dout, lse, q, k,
                                                                                      v, T_, NH, NKV, HD, scale);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
