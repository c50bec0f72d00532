#include "atoll/backend/cuda/device.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "atoll/backend/cuda/arena.h"
#include "atoll/backend/cuda/blas.h"
#include "atoll/backend/cuda/check.h"

namespace atl::gpu {

std::string describe_device() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error
    throw GpuError(std::string("no usable GPU: ") + cudaGetErrorString(err));
  }
  if (count == 0) throw GpuError("no usable GPU: the runtime reports 0 devices");
  int dev = 0;
  ATOLL_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  ATOLL_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  size_t free_b = 0, total_b = 0;
  ATOLL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s device %d of %d: %s, %.1f GiB (%.1f GiB free)",
#if defined(ATOLL_GPU_HIP)
                "hip",
#else
                "cuda",
#endif
                dev, count, prop.name, total_b / kGiB, free_b / kGiB);
  return buf;
}

int select_device(int index) {
  int count = 0;
  ATOLL_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count == 0) throw GpuError("no usable GPU: the runtime reports 0 devices");
  const int dev = ((index % count) + count) % count;
  ATOLL_CUDA_CHECK(cudaSetDevice(dev));
  return dev;
}

void memory_info(size_t* free_bytes, size_t* total_bytes) {
  ATOLL_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

void synchronize() { ATOLL_CUDA_CHECK(cudaDeviceSynchronize()); }

double measure_matmul_peak_gflops(int n, int reps, bool bf16) {
  DeviceArena arena(3 * (size_t(n) * n * sizeof(float) + DeviceArena::kAlign));
  float* a = arena.alloc<float>(size_t(n) * n);
  float* b = arena.alloc<float>(size_t(n) * n);
  float* c = arena.alloc<float>(size_t(n) * n);
  // Bytes 0x3c: every fp32 or bf16 element ~0.0115, finite. Zeros would flatter the peak (less
  // switching power: ~13% faster bf16 products measured on an H200).
  ATOLL_CUDA_CHECK(cudaMemset(a, 0x3c, sizeof(float) * n * n));
  ATOLL_CUDA_CHECK(cudaMemset(b, 0x3c, sizeof(float) * n * n));
  const Dtype in = bf16 ? Dtype::kBF16 : Dtype::kF32;  // bf16: the first half of each buffer
  Blas blas;
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {  // the first run loads the kernels
    synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    blas.gemm(false, true, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n, in);
    synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
  }
  return 2.0 * n * n * n / best * 1e-9;
}

}  // namespace atl::gpu
