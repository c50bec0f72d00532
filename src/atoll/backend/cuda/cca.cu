#include "atoll/backend/cuda/cca.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"

namespace atl::gpu {
namespace {

// CcaDims' sizes on the device too (its member functions are host-only C++).
__host__ __device__ inline int qd(const CcaDims& d) { return d.NH * d.HD; }
__host__ __device__ inline int kvd(const CcaDims& d) { return d.NKV * d.HD; }
__host__ __device__ inline int cc(const CcaDims& d) { return (d.NH + d.NKV) * d.HD; }
__host__ __device__ inline int ty(const CcaDims& d) { return d.T + d.t1 - 1; }

// One thread per output element; each thread's sums run in layers/cca.cc's order.

// y at time u - (t1-1) reads x at times u - lag .. u - (t1-1); earlier than 0 is the padding.
__global__ void conv_y_kernel(float* y, const float* x, const float* w0, const float* b0, CcaDims d, size_t n) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int CC = cc(d), TY = ty(d), lag = (d.t1 - 1) + (d.t0 - 1);
  const int c = int(idx % CC), u = int((idx / CC) % TY), b = int(idx / (size_t(CC) * TY));
  float s = b0[c];
  for (int j = 0; j < d.t0; ++j) {
    const int tx = u - lag + j;
    if (tx >= 0) s += w0[size_t(c) * d.t0 + j] * x[(size_t(b) * d.T + tx) * CC + c];
  }
  y[idx] = s;
}

__global__ void conv_z_kernel(float* z, const float* y, const float* w1, const float* b1, CcaDims d, size_t n) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int CC = cc(d), TY = ty(d), HD = d.HD;
  const int c = int(idx % CC), t = int((idx / CC) % d.T), b = int(idx / (size_t(CC) * d.T)), g0 = c / HD * HD;
  float s = b1[c];
  for (int ci = 0; ci < HD; ++ci)
    for (int j = 0; j < d.t1; ++j)
      s += w1[(size_t(c) * HD + ci) * d.t1 + j] * y[(size_t(b) * TY + t + j) * CC + g0 + ci];
  z[idx] = s;
}

// dw1[c,ci,j] (+=) over every token; db1 by the threads of ci = j = 0.
__global__ void conv_dw1_kernel(float* dw1, float* db1, const float* dz, const float* y, CcaDims d, size_t n) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int CC = cc(d), TY = ty(d), HD = d.HD;
  const int j = int(idx % d.t1), ci = int((idx / d.t1) % HD), c = int(idx / (size_t(d.t1) * HD)), g0 = c / HD * HD;
  float s = 0, sb = 0;
  for (int b = 0; b < d.B; ++b)
    for (int t = 0; t < d.T; ++t) {
      const float g = dz[(size_t(b) * d.T + t) * CC + c];
      s += g * y[(size_t(b) * TY + t + j) * CC + g0 + ci];
      sb += g;
    }
  dw1[idx] += s;
  if (ci == 0 && j == 0) db1[c] += sb;
}

__global__ void conv_dy_kernel(float* dy, const float* dz, const float* w1, CcaDims d, size_t n) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int CC = cc(d), TY = ty(d), HD = d.HD;
  const int c2 = int(idx % CC), u = int((idx / CC) % TY), b = int(idx / (size_t(CC) * TY));
  const int g0 = c2 / HD * HD, ci = c2 - g0;
  float s = 0;
  for (int j = 0; j < d.t1; ++j) {
    const int t = u - j;
    if (t < 0 || t >= d.T) continue;
    const float* g = dz + (size_t(b) * d.T + t) * CC + g0;
    for (int co = 0; co < HD; ++co) s += g[co] * w1[(size_t(g0 + co) * HD + ci) * d.t1 + j];
  }
  dy[idx] = s;
}

// dw0[c,j] (+=) over every time of y, padding included; db0 by the threads of j = 0.
__global__ void conv_dw0_kernel(float* dw0, float* db0, const float* dy, const float* x, CcaDims d, size_t n) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int CC = cc(d), TY = ty(d), lag = (d.t1 - 1) + (d.t0 - 1);
  const int j = int(idx % d.t0), c = int(idx / d.t0);
  float s = 0, sb = 0;
  for (int b = 0; b < d.B; ++b)
    for (int u = 0; u < TY; ++u) {
      const float g = dy[(size_t(b) * TY + u) * CC + c];
      sb += g;
      const int tx = u - lag + j;
      if (tx >= 0) s += g * x[(size_t(b) * d.T + tx) * CC + c];
    }
  dw0[idx] += s;
  if (j == 0) db0[c] += sb;
}

__global__ void conv_dx_kernel(float* dx, const float* dy, const float* w0, CcaDims d, size_t n) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int CC = cc(d), TY = ty(d), lag = (d.t1 - 1) + (d.t0 - 1);
  const int c = int(idx % CC), tx = int((idx / CC) % d.T), b = int(idx / (size_t(CC) * d.T));
  float s = 0;
  for (int j = 0; j < d.t0; ++j) {
    const int u = tx + lag - j;
    if (u < TY) s += dy[(size_t(b) * TY + u) * CC + c] * w0[size_t(c) * d.t0 + j];
  }
  dx[idx] += s;
}

// One thread per (token, kv head, i): its G query entries and its key entry.
__global__ void qk_mean_kernel(float* q, float* k, const float* z, const float* x, CcaDims d, size_t n) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int HD = d.HD, QD = qd(d), CC = cc(d), G = d.NH / d.NKV;
  const int i = int(idx % HD), hk = int((idx / HD) % d.NKV);
  const size_t tok = idx / (size_t(HD) * d.NKV);
  const float* xr = x + tok * CC;
  const float* zr = z + tok * CC;
  const float kp = xr[QD + hk * HD + i];
  float mk = 0;
  for (int g = 0; g < G; ++g) {
    const int hq = hk * G + g;
    const float mq = (xr[hq * HD + i] + kp) / 2.f;
    q[tok * QD + hq * HD + i] = zr[hq * HD + i] + mq;
    mk += mq;
  }
  k[tok * kvd(d) + hk * HD + i] = zr[QD + hk * HD + i] + mk / float(G);
}

__global__ void qk_mean_backward_kernel(float* dz, float* dx, const float* dq, const float* dk, CcaDims d, size_t n) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int HD = d.HD, QD = qd(d), CC = cc(d), G = d.NH / d.NKV;
  const int i = int(idx % HD), hk = int((idx / HD) % d.NKV);
  const size_t tok = idx / (size_t(HD) * d.NKV);
  const float dkv = dk[tok * kvd(d) + hk * HD + i];
  float dkp = 0;
  for (int g = 0; g < G; ++g) {
    const int hq = hk * G + g;
    const float dqv = dq[tok * QD + hq * HD + i];
    dz[tok * CC + hq * HD + i] = dqv;
    const float dmq = dqv + dkv / float(G);
    dx[tok * CC + hq * HD + i] += dmq / 2.f;
    dkp += dmq / 2.f;
  }
  dz[tok * CC + QD + hk * HD + i] = dkv;
  dx[tok * CC + QD + hk * HD + i] += dkp;
}

// One thread per (token, head) of `heads` heads; scale times temp[head] when temp is given.
__global__ void norm_kernel(float* out, float* r, const float* in, const float* temp, int heads, int HD, size_t n) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const float* v = in + idx * HD;
  float ss = 0;
  for (int i = 0; i < HD; ++i) ss += v[i] * v[i];
  const float ri = 1.f / fmaxf(sqrtf(ss), float(kCcaNormEps));
  const float scale = sqrtf(float(HD)) * (temp ? temp[idx % heads] : 1.f);
  for (int i = 0; i < HD; ++i) out[idx * HD + i] = v[i] * scale * ri;
  r[idx] = ri;
}

// dx = r (du − u (u·du)), u = x r, du = dout · scale; part[idx] (=) √HD · u·dout (for dtemp).
__global__ void norm_backward_kernel(float* dx, float* part, const float* dout, const float* x, const float* r,
                                     const float* temp, int heads, int HD, size_t n) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const float* xv = x + idx * HD;
  const float* g = dout + idx * HD;
  const float ri = r[idx], s = sqrtf(float(HD)), scale = s * (temp ? temp[idx % heads] : 1.f);
  float udout = 0;
  for (int i = 0; i < HD; ++i) udout += xv[i] * ri * g[i];
  const float udu = udout * scale;
  for (int i = 0; i < HD; ++i) dx[idx * HD + i] = ri * (g[i] * scale - xv[i] * ri * udu);
  if (part) part[idx] = s * udout;
}

// dtemp[h] (+=) the sum over tokens of part[n,h], serial per head.
__global__ void temp_sum_kernel(float* dtemp, const float* part, int N, int NKV) {
  const int h = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h >= NKV) return;
  float s = 0;
  for (int n = 0; n < N; ++n) s += part[size_t(n) * NKV + h];
  dtemp[h] += s;
}

__global__ void value_kernel(float* v, const float* vc, const float* vd, CcaDims d, size_t n) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int KVD = kvd(d), half = KVD / 2, i = int(idx % KVD);
  const size_t tok = idx / KVD;
  if (i < half)
    v[idx] = vc[tok * half + i];
  else
    v[idx] = tok % d.T == 0 ? 0.f : vd[(tok - 1) * half + i - half];
}

__global__ void value_backward_kernel(float* dvc, float* dvd, const float* dv, CcaDims d, size_t n) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int KVD = kvd(d), half = KVD / 2, i = int(idx % half);
  const size_t tok = idx / half;
  dvc[idx] = dv[tok * KVD + i];
  dvd[idx] = (tok + 1) % d.T == 0 ? 0.f : dv[(tok + 1) * KVD + half + i];
}

__global__ void pack_kernel(float* packed, float* a, float* b, int A, int Bw, bool pack, size_t n) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int W = A + Bw, i = int(idx % W);
  const size_t row = idx / W;
  float* side = i < A ? a + row * A + i : b + row * Bw + (i - A);
  if (pack)
    packed[idx] = *side;
  else
    *side = packed[idx];
}

template <typename K, typename... Args>
void launch(K kernel, size_t n, cudaStream_t stream, Args... args) {
  if (n == 0) return;
  kernel<<<grid_for(n), kBlock, 0, stream>>>(args..., n);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void cca_conv_forward(float* z, float* y, const float* x, const float* w0, const float* b0, const float* w1,
                      const float* b1, const CcaDims& d, cudaStream_t stream) {
  launch(conv_y_kernel, size_t(d.B) * ty(d) * cc(d), stream, y, x, w0, b0, d);
  launch(conv_z_kernel, size_t((d.B * d.T)) * cc(d), stream, z, static_cast<const float*>(y), w1, b1, d);
}

void cca_conv_backward(float* dx, float* dw0, float* db0, float* dw1, float* db1, float* dy, const float* dz,
                       const float* y, const float* x, const float* w0, const float* w1, const CcaDims& d,
                       cudaStream_t stream) {
  launch(conv_dw1_kernel, size_t(cc(d)) * d.HD * d.t1, stream, dw1, db1, dz, y, d);
  launch(conv_dy_kernel, size_t(d.B) * ty(d) * cc(d), stream, dy, dz, w1, d);
  launch(conv_dw0_kernel, size_t(cc(d)) * d.t0, stream, dw0, db0, static_cast<const float*>(dy), x, d);
  launch(conv_dx_kernel, size_t((d.B * d.T)) * cc(d), stream, dx, static_cast<const float*>(dy), w0, d);
}

void cca_qk_mean_forward(float* q, float* k, const float* z, const float* x, const CcaDims& d, cudaStream_t stream) {
  launch(qk_mean_kernel, size_t((d.B * d.T)) * kvd(d), stream, q, k, z, x, d);
}

void cca_qk_mean_backward(float* dz, float* dx, const float* dq, const float* dk, const CcaDims& d,
                          cudaStream_t stream) {
  launch(qk_mean_backward_kernel, size_t((d.B * d.T)) * kvd(d), stream, dz, dx, dq, dk, d);
}

void cca_qk_norm_forward(float* qn, float* kn, float* rq, float* rk, const float* q, const float* k,
                         const float* temp, const CcaDims& d, cudaStream_t stream) {
  launch(norm_kernel, size_t((d.B * d.T)) * d.NH, stream, qn, rq, q, static_cast<const float*>(nullptr), d.NH, d.HD);
  launch(norm_kernel, size_t((d.B * d.T)) * d.NKV, stream, kn, rk, k, temp, d.NKV, d.HD);
}

void cca_qk_norm_backward(float* dq, float* dk, float* dtemp, float* part, const float* dqn, const float* dkn,
                          const float* q, const float* k, const float* rq, const float* rk, const float* temp,
                          const CcaDims& d, cudaStream_t stream) {
  launch(norm_backward_kernel, size_t((d.B * d.T)) * d.NH, stream, dq, static_cast<float*>(nullptr), dqn, q, rq,
         static_cast<const float*>(nullptr), d.NH, d.HD);
  launch(norm_backward_kernel, size_t((d.B * d.T)) * d.NKV, stream, dk, part, dkn, k, rk, temp, d.NKV, d.HD);
  temp_sum_kernel<<<1, kBlock, 0, stream>>>(dtemp, part, (d.B * d.T), d.NKV);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void cca_value_forward(float* v, const float* vc, const float* vd, const CcaDims& d, cudaStream_t stream) {
  launch(value_kernel, size_t((d.B * d.T)) * kvd(d), stream, v, vc, vd, d);
}

void cca_value_backward(float* dvc, float* dvd, const float* dv, const CcaDims& d, cudaStream_t stream) {
  launch(value_backward_kernel, size_t((d.B * d.T)) * (kvd(d) / 2), stream, dvc, dvd, dv, d);
}

void pack_rows(float* out, const float* a, const float* b, int N, int A, int Bw, cudaStream_t stream) {
  launch(pack_kernel, size_t(N) * (A + Bw), stream, out, const_cast<float*>(a), const_cast<float*>(b), A, Bw, true);
}

void unpack_rows(float* a, float* b, const float* in, int N, int A, int Bw, cudaStream_t stream) {
  launch(pack_kernel, size_t(N) * (A + Bw), stream, const_cast<float*>(in), a, b, A, Bw, false);
}

}  // namespace atl::gpu
