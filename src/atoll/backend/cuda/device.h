// Which GPU a process uses, for messages and synchronisation from code compiled without the
// GPU headers (the trainer, the CLI). Plain C++: no vendor header is included.
#pragma once

#include <string>

namespace atl::gpu {

// "cuda device 0: NVIDIA H100 80GB HBM3, 79.1 GiB (78.6 GiB free)". Throws GpuError with the
// runtime's reason (no device, no driver) when no device can be used.
std::string describe_device();

// Waits until every operation queued on the device has finished (timing, before host reads
// that do not synchronise by themselves). Throws GpuError on an earlier asynchronous fault.
void synchronize();

// Best of `reps` fp32 products n×n×n through the BLAS wrapper (cuBLAS, no TF32), GFLOP/s: the
// peak `atoll bench` reports MFU against on the device.
double measure_matmul_peak_gflops(int n = 4096, int reps = 5);

}  // namespace atl::gpu
