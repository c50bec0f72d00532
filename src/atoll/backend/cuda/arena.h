// Device memory: one cudaMalloc up front, handed out by bumping a pointer (a linear arena), as
// llm.c sizes its activations once. A training step then allocates nothing; scratch taken for
// one call goes back with release(mark). Not thread-safe; one arena per stream of work.
#pragma once

#include <cstddef>
#include <cstdint>

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

class DeviceArena {
 public:
  // Reserves `bytes` of device memory; throws GpuError when the device has no room.
  explicit DeviceArena(size_t bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // n elements of T, aligned to kAlign bytes, uninitialised. Throws GpuError when the arena is
  // full (the message gives the request and what is left), leaving the arena as it was.
  template <typename T>
  T* alloc(size_t n) {
    return static_cast<T*>(alloc_bytes(n * sizeof(T)));
  }
  void* alloc_bytes(size_t bytes);

  // mark()/release(m): everything allocated after the mark goes back at once.
  size_t mark() const { return used_; }
  void release(size_t mark);
  void reset() { used_ = 0; }

  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }

  static constexpr size_t kAlign = 256;  // cudaMalloc's own alignment; enough for any vector load

 private:
  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
};

// Synchronous copies for setup and tests (the hot path uses cudaMemcpyAsync on its stream).
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);

// Host-side check that every id in ids[n] (device) lies in [0, limit): throws CheckError
// naming the first offender. Synchronises the stream; kernels themselves never throw, and
// treat an out-of-range id as described in their headers.
void check_ids(const int32_t* ids, int n, int limit, const char* what, cudaStream_t stream = nullptr);

}  // namespace atl::gpu
