#include "atoll/backend/cuda/embedding.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"
#include "atoll/backend/cuda/sort.h"

namespace atl::gpu {
namespace {

// Block per position, threads along C.
__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte, int C, int V) {
  const size_t n = blockIdx.x;
  const int32_t tok = tokens[n];
  const bool ok = tok >= 0 && tok < V;
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[n * C + c] = ok ? wte[size_t(tok) * C + c] : 0.f;
}

__global__ void embedding_backward_atomic_kernel(float* dwte, const float* dout, const int32_t* tokens, int C, int V) {
  const size_t n = blockIdx.x;
  const int32_t tok = tokens[n];
  if (tok < 0 || tok >= V) return;
  for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(dwte + size_t(tok) * C + c, dout[n * C + c]);
}

// Block per sorted position; only the first position of each run of equal tokens works: it
// adds the run's rows, in position order, onto the token's row. Each row of dwte is written by
// one block, so no atomics.
__global__ void embedding_backward_sorted_kernel(float* dwte, const float* dout, const int32_t* sorted_tok,
                                                 const int32_t* order, int N, int C, int V) {
  const int i = blockIdx.x;
  const int32_t tok = sorted_tok[i];
  if ((i > 0 && sorted_tok[i - 1] == tok) || tok < 0 || tok >= V) return;
  float* dst = dwte + size_t(tok) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = dst[c];
    for (int j = i; j < N && sorted_tok[j] == tok; ++j) acc += dout[size_t(order[j]) * C + c];
    dst[c] = acc;
  }
}

}  // namespace

int64_t embedding_scratch_ints(int N) { return 2 * int64_t(N) + sort_scratch_ints(N); }

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C, int V, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  embedding_forward_kernel<<<N, kBlock, 0, stream>>>(out, tokens, wte, C, V);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C, int V, Scatter scatter,
                        int32_t* scratch, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (scatter == Scatter::kAtomic) {
    embedding_backward_atomic_kernel<<<N, kBlock, 0, stream>>>(dwte, dout, tokens, C, V);
    ATOLL_CUDA_CHECK_LAUNCH();
    return;
  }
  int32_t* sorted_tok = scratch;  // [N]
  int32_t* order = scratch + N;   // [N]
  int32_t* sort_tmp = order + N;  // [4N]
  // Out-of-range ids would be sorted by their low bits only; the kernel skips them either way.
  stable_sort_by_key(sorted_tok, order, tokens, N, V, sort_tmp, stream);
  embedding_backward_sorted_kernel<<<N, kBlock, 0, stream>>>(dwte, dout, sorted_tok, order, N, C, V);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
