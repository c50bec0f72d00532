// Whole-sequence causal attention: the tiled kernels of attention_tiles.cuh with every
// sequence one chunk (nothing to merge, so the forward starts empty and finishes in one pass).
#include "atoll/backend/cuda/attention.h"

#include "atoll/backend/cuda/attention_tiles.cuh"
#include "atoll/backend/cuda/check.h"

namespace atl::gpu {
namespace {

RingChunks whole(int T_) {
  RingChunks c;
  c.id[0] = 0, c.id[1] = 1, c.len[0] = T_, c.len[1] = 0;
  return c;
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int B, int T_, int NH,
                       int NKV, int HD, cudaStream_t stream) {
  check_attention_shape(B, T_, T_, NH, NKV, HD);
  if (B == 0 || T_ == 0 || NH == 0) return;
  attention_tile_forward_kernel<<<dim3(T_, NH, B), kAttnThreads, forward_smem(HD), stream>>>(
      out, lse, nullptr, q, T_, whole(T_), k, v, T_, whole(T_), NH, NKV, HD, attention_scale(HD), true, true);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, int B, int T_, int NH, int NKV, int HD,
                        float* scratch, cudaStream_t stream) {
  check_attention_shape(B, T_, T_, NH, NKV, HD);
  if (B == 0 || T_ == 0 || NH == 0) return;
  const float scale = attention_scale(HD);
  const size_t rows = size_t(B) * T_ * NH;
  attention_row_dot_kernel<<<grid_for(rows), kBlock, 0, stream>>>(scratch, dout, out, T_, NH, HD, rows);
  ATOLL_CUDA_CHECK_LAUNCH();
  attention_tile_dq_kernel<<<dim3(T_, NH, B), kAttnThreads, dq_smem(HD), stream>>>(
      dq, dout, scratch, lse, q, T_, whole(T_), k, v, T_, whole(T_), NH, NKV, HD, scale, false);
  ATOLL_CUDA_CHECK_LAUNCH();
  attention_tile_dkdv_kernel<<<dim3(T_, NKV, B), kAttnThreads, dkdv_smem(HD), stream>>>(
      dk, dv, dout, scratch, lse, q, T_, whole(T_), k, v, T_, whole(T_), NH, NKV, HD, scale, false);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
