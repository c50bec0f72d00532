#include "atoll/backend/cuda/arena.h"

#include <algorithm>
#include <sstream>

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"
#include "atoll/core/check.h"

namespace atl::gpu {

DeviceArena::DeviceArena(size_t bytes) : capacity_(bytes) {
  if (bytes > 0) ATOLL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&base_), bytes));
}

DeviceArena::~DeviceArena() {
  if (base_) (void)cudaFree(base_);  // a destructor must not throw; nothing to do on failure
}

void* DeviceArena::alloc_bytes(size_t bytes) {
  const size_t start = (used_ + kAlign - 1) / kAlign * kAlign;
  if (start > capacity_ || bytes > capacity_ - start) {
    std::ostringstream msg;
    msg << "device arena full: " << bytes << " bytes requested, " << (capacity_ - std::min(start, capacity_)) << " of "
        << capacity_ << " left";
    throw GpuError(msg.str());
  }
  used_ = start + bytes;
  return base_ + start;
}

void DeviceArena::release(size_t mark) {
  ATOLL_CHECK_LE(mark, used_) << "release to a mark above the arena's use";
  used_ = mark;
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) ATOLL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) ATOLL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

namespace {

// first[0] = smallest index of an id outside [0, limit), or n when all are in range.
__global__ void first_bad_id_kernel(int* first, const int32_t* ids, int n, int limit) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && (ids[i] < 0 || ids[i] >= limit)) atomicMin(first, i);
}

}  // namespace

void check_ids(const int32_t* ids, int n, int limit, const char* what, cudaStream_t stream) {
  if (n <= 0) return;
  int* d_first = nullptr;
  ATOLL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_first), sizeof(int)));
  int first = n;
  ATOLL_CUDA_CHECK(cudaMemcpyAsync(d_first, &first, sizeof(int), cudaMemcpyHostToDevice, stream));
  first_bad_id_kernel<<<grid_for(n), kBlock, 0, stream>>>(d_first, ids, n, limit);
  ATOLL_CUDA_CHECK_LAUNCH();
  ATOLL_CUDA_CHECK(cudaMemcpyAsync(&first, d_first, sizeof(int), cudaMemcpyDeviceToHost, stream));
  ATOLL_CUDA_CHECK(cudaStreamSynchronize(stream));
  ATOLL_CUDA_CHECK(cudaFree(d_first));
  if (first < n) {
    int32_t bad = 0;
    ATOLL_CUDA_CHECK(cudaMemcpy(&bad, ids + first, sizeof(int32_t), cudaMemcpyDeviceToHost));
    ATOLL_CHECK(false) << what << " id " << bad << " at position " << first << " outside [0, " << limit << ")";
  }
}

}  // namespace atl::gpu
