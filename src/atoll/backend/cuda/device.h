// Which GPU a process uses, for messages and synchronisation from code compiled without the
// GPU headers (the trainer, the CLI). Plain C++: no vendor header is included.
#pragma once

#include <cstddef>
#include <string>

namespace atl::gpu {

// "cuda device 0: NVIDIA H100 80GB HBM3, 79.1 GiB (78.6 GiB free)". Throws GpuError with the
// runtime's reason (no device, no driver) when no device can be used.
std::string describe_device();

// Makes device `index` modulo the number of devices current for this thread (an island
// worker's rank picks its GPU); returns the device taken. GpuError when there is none.
int select_device(int index);

// Free and total bytes of the current device (cudaMemGetInfo). GpuError when there is none.
void memory_info(size_t* free_bytes, size_t* total_bytes);

// Waits until every operation queued on the device has finished (timing, before host reads
// that do not synchronise by themselves). Throws GpuError on an earlier asynchronous fault.
void synchronize();

// Best of `reps` products n×n×n through the BLAS wrapper (cuBLAS, fp32 accumulation, no TF32),
// GFLOP/s: the peak `atoll bench` reports MFU against on the device. Inputs fp32, or bf16 with
// `bf16` (train.precision = bf16: the products' own input type).
double measure_matmul_peak_gflops(int n = 4096, int reps = 5, bool bf16 = false);

}  // namespace atl::gpu
