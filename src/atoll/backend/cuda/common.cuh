// Device-side helpers shared by the kernels of backend/cuda/: launch geometry, block-wide
// reductions. Written with nothing vendor-specific (no warp shuffles, no
// warp-size assumptions: AMD's wavefronts are 64 wide), so the same code compiles as HIP.
#pragma once

#include <cstddef>
#include <cstdint>

#include "atoll/backend/cuda/bf16.h"
#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// Threads per block for the elementwise and row kernels. A power of two (block_sum needs it).
inline constexpr int kBlock = 256;

inline unsigned grid_for(size_t n, int block = kBlock) { return unsigned((n + block - 1) / block); }

// Sum of v over the block, returned to every thread. `buf` is shared memory of blockDim.x
// elements; blockDim.x must be a power of two. The tree has a fixed shape, so the result does
// not depend on scheduling (bit-reproducible run to run). Every thread of the block must call it.
template <typename T>
__device__ T block_sum(T v, T* buf) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  const T r = buf[0];
  __syncthreads();  // buf may be reused straight away
  return r;
}

// Maximum of v over the block, as block_sum.
template <typename T>
__device__ T block_max(T v, T* buf) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s)
      buf[threadIdx.x] = buf[threadIdx.x + s] > buf[threadIdx.x] ? buf[threadIdx.x + s] : buf[threadIdx.x];
    __syncthreads();
  }
  const T r = buf[0];
  __syncthreads();
  return r;
}

}  // namespace atl::gpu
