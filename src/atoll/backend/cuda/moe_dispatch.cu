#include "atoll/backend/cuda/moe_dispatch.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"
#include "atoll/backend/cuda/sort.h"
#include "atoll/core/check.h"

namespace atl::gpu {
namespace {

// The sort key of each slot: its expert, or E for a skipped slot (kNoExpert), which so sorts last.
__global__ void routing_keys_kernel(int32_t* keys, const int32_t* topk_idx, int R, int E) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < R) keys[i] = topk_idx[i] < 0 ? E : topk_idx[i];
}

// order[row] = slot i = n*K + j of the row (from the stable sort). A skipped slot's row (past
// offsets[E]) is no expert's: its slot gets row -1.
__global__ void routing_rows_kernel(int32_t* row_token, int32_t* slot_row, const int32_t* order,
                                    const int32_t* sorted_expert, int R, int E, int K) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= R) return;
  const int32_t slot = order[row];
  row_token[row] = slot / K;
  slot_row[slot] = sorted_expert[row] == E ? -1 : row;
}

// offsets[e] = first row whose expert is >= e (binary search in the sorted ids), e in [0, E].
__global__ void routing_offsets_kernel(int32_t* offsets, const int32_t* sorted_expert, int R, int E) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e > E) return;
  int lo = 0, hi = R;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (sorted_expert[mid] < e)
      lo = mid + 1;
    else
      hi = mid;
  }
  offsets[e] = lo;
}

__global__ void dispatch_forward_kernel(float* xe, const float* x, const int32_t* row_token, int C) {
  const size_t row = blockIdx.x;
  const float* src = x + size_t(row_token[row]) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) xe[row * C + c] = src[c];
}

__global__ void dispatch_backward_kernel(float* dx, const float* dxe, const int32_t* slot_row, int C, int K) {
  const size_t n = blockIdx.x;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = dx[n * C + c];
    for (int j = 0; j < K; ++j) {
      const int32_t row = slot_row[n * K + j];
      if (row >= 0) acc += dxe[size_t(row) * C + c];
    }
    dx[n * C + c] = acc;
  }
}

__global__ void combine_forward_kernel(float* out, const float* ye, const float* topk_w, const int32_t* slot_row, int C,
                                       int K) {
  const size_t n = blockIdx.x;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < K; ++j) {  // a skipped slot adds nothing (its row, past the experts', is never computed)
      const int32_t row = slot_row[n * K + j];
      if (row >= 0) acc += topk_w[n * K + j] * ye[size_t(row) * C + c];
    }
    out[n * C + c] = acc;
  }
}

// Block per slot i = n*K + j.
__global__ void combine_backward_kernel(float* dye, float* dtopk_w, const float* dout, const float* ye,
                                        const float* topk_w, const int32_t* slot_row, int C, int K) {
  __shared__ float buf[kBlock];
  const size_t slot = blockIdx.x;
  if (slot_row[slot] < 0) {  // a skipped slot: no row, no gradient (the whole block returns)
    if (threadIdx.x == 0) dtopk_w[slot] = 0.f;
    return;
  }
  const size_t row = size_t(slot_row[slot]);
  const float w = topk_w[slot];
  const float* g = dout + (slot / K) * C;
  const float* y = ye + row * C;
  float* dy = dye + row * C;
  float acc = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    dy[c] = w * g[c];
    acc += g[c] * y[c];
  }
  acc = block_sum(acc, buf);
  if (threadIdx.x == 0) dtopk_w[slot] = acc;
}

}  // namespace

int64_t routing_scratch_ints(int N, int K) {
  const int64_t R = int64_t(N) * K;
  return 3 * R + sort_scratch_ints(int(R));
}

void build_routing(const DeviceRouting& r, const int32_t* topk_idx, int N, int E, int K, int32_t* scratch,
                   cudaStream_t stream) {
  ATOLL_CHECK(N >= 0 && E >= 1 && K >= 1) << "routing N=" << N << " E=" << E << " K=" << K;
  const int64_t R64 = int64_t(N) * K;
  ATOLL_CHECK_LT(R64, int64_t(1) << 31) << "routed rows";
  const int R = int(R64);
  int32_t* sorted_expert = scratch;  // [R]
  int32_t* order = scratch + R;      // [R]
  int32_t* keys = order + R;         // [R]
  int32_t* sort_tmp = keys + R;      // [4R]
  if (R > 0) {
    routing_keys_kernel<<<grid_for(R), kBlock, 0, stream>>>(keys, topk_idx, R, E);
    ATOLL_CUDA_CHECK_LAUNCH();
    stable_sort_by_key(sorted_expert, order, keys, R, E + 1, sort_tmp, stream);
    routing_rows_kernel<<<grid_for(R), kBlock, 0, stream>>>(r.row_token, r.slot_row, order, sorted_expert, R, E, K);
    ATOLL_CUDA_CHECK_LAUNCH();
  }
  routing_offsets_kernel<<<grid_for(size_t(E) + 1), kBlock, 0, stream>>>(r.offsets, sorted_expert, R, E);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void dispatch_forward(float* xe, const float* x, const DeviceRouting& r, int N, int C, int K, cudaStream_t stream) {
  const int64_t R = int64_t(N) * K;
  if (R <= 0 || C <= 0) return;
  dispatch_forward_kernel<<<unsigned(R), kBlock, 0, stream>>>(xe, x, r.row_token, C);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void dispatch_backward(float* dx, const float* dxe, const DeviceRouting& r, int N, int C, int K, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  dispatch_backward_kernel<<<N, kBlock, 0, stream>>>(dx, dxe, r.slot_row, C, K);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void combine_forward(float* out, const float* ye, const float* topk_w, const DeviceRouting& r, int N, int C, int K,
                     cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  combine_forward_kernel<<<N, kBlock, 0, stream>>>(out, ye, topk_w, r.slot_row, C, K);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void combine_backward(float* dye, float* dtopk_w, const float* dout, const float* ye, const float* topk_w,
                      const DeviceRouting& r, int N, int C, int K, cudaStream_t stream) {
  if (N <= 0) return;
  combine_backward_kernel<<<unsigned(int64_t(N) * K), kBlock, 0, stream>>>(dye, dtopk_w, dout, ye, topk_w, r.slot_row,
                                                                           C, K);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
