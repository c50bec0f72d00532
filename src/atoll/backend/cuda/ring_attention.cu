// The ring's steps: the tiled kernels of attention_tiles.cuh over two chunks a side, the forward
// state kept between steps.
#include "atoll/backend/cuda/ring_attention.h"

#include "atoll/backend/cuda/attention_tiles.cuh"
#include "atoll/backend/cuda/check.h"

namespace atl::gpu {
namespace {

__global__ void ring_start_kernel(float* acc, float* m, float* l, size_t n_acc, size_t n_rows) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n_acc) acc[i] = 0.f;
  if (i < n_rows) m[i] = -INFINITY, l[i] = 0.f;
}

// One thread per (b, t, h) row: out = acc / l, lse = m + log l, in place.
__global__ void ring_finish_kernel(float* out, float* lse, const float* l, int Tq, int NH, int HD, size_t rows) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  const int h = int(i % NH), t = int((i / NH) % Tq), b = int(i / (size_t(NH) * Tq));
  const size_t li = (size_t(b) * NH + h) * Tq + t;
  const float inv = 1.f / l[li];
  for (int e = 0; e < HD; ++e) out[i * HD + e] *= inv;
  lse[li] += logf(l[li]);
}

void check_chunks(const RingChunks& c, int rows, const char* what) {
  ATOLL_CHECK(c.len[0] >= 0 && c.len[1] >= 0 && c.rows() == rows)
      << what << " chunks of " << c.len[0] << " + " << c.len[1] << " rows for " << rows << " local rows";
}

// False when there is nothing to compute; CheckError on a bad shape.
bool check_step(int B, int Tq, const RingChunks& qc, int Tk, const RingChunks& kc, int NH, int NKV, int HD) {
  check_attention_shape(B, Tq, Tk, NH, NKV, HD);
  check_chunks(qc, Tq, "query");
  check_chunks(kc, Tk, "key");
  return B > 0 && Tq > 0 && Tk > 0 && NH > 0;
}

}  // namespace

void ring_forward_start(float* acc, float* m, float* l, int B, int Tq, int NH, int HD, cudaStream_t stream) {
  const size_t rows = size_t(B) * Tq * NH, n_acc = rows * HD;
  if (n_acc == 0) return;
  ring_start_kernel<<<grid_for(n_acc), kBlock, 0, stream>>>(acc, m, l, n_acc, rows);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void ring_forward_step(float* acc, float* m, float* l, const float* q, int Tq, const RingChunks& qc, const float* k,
                       const float* v, int Tk, const RingChunks& kc, int B, int NH, int NKV, int HD,
                       cudaStream_t stream) {
  if (!check_step(B, Tq, qc, Tk, kc, NH, NKV, HD)) return;
  attention_tile_forward_kernel<<<dim3(Tq, NH, B), kAttnThreads, forward_smem(HD), stream>>>(
      acc, m, l, q, Tq, qc, k, v, Tk, kc, NH, NKV, HD, attention_scale(HD), false, false);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void ring_forward_finish(float* out, float* lse, const float* l, int B, int Tq, int NH, int HD, cudaStream_t stream) {
  const size_t rows = size_t(B) * Tq * NH;
  if (rows == 0) return;
  ring_finish_kernel<<<grid_for(rows), kBlock, 0, stream>>>(out, lse, l, Tq, NH, HD, rows);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void ring_row_dot(float* D, const float* dout, const float* out, int B, int Tq, int NH, int HD, cudaStream_t stream) {
  const size_t rows = size_t(B) * Tq * NH;
  if (rows == 0) return;
  attention_row_dot_kernel<<<grid_for(rows), kBlock, 0, stream>>>(D, dout, out, Tq, NH, HD, rows);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void ring_backward_step(float* dq, float* dk, float* dv, const float* dout, const float* D, const float* lse,
                        const float* q, int Tq, const RingChunks& qc, const float* k, const float* v, int Tk,
                        const RingChunks& kc, int B, int NH, int NKV, int HD, cudaStream_t stream) {
  if (!check_step(B, Tq, qc, Tk, kc, NH, NKV, HD)) return;
  const float scale = attention_scale(HD);
  attention_tile_dq_kernel<<<dim3(Tq, NH, B), kAttnThreads, dq_smem(HD), stream>>>(
      dq, dout, D, lse, q, Tq, qc, k, v, Tk, kc, NH, NKV, HD, scale, true);
  ATOLL_CUDA_CHECK_LAUNCH();
  attention_tile_dkdv_kernel<<<dim3(Tk, NKV, B), kAttnThreads, dkdv_smem(HD), stream>>>(
      dk, dv, dout, D, lse, q, Tq, qc, k, v, Tk, kc, NH, NKV, HD, scale, true);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
