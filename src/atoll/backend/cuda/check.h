// Error checking for the GPU runtime and BLAS. A failed call throws atl::GpuError (a typed
// environment failure, core/errors.h) whose message names the file, line, the call and the
// runtime's own description, e.g.
//   src/atoll/backend/cuda/arena.cu:21: cudaMalloc(&base_, bytes) failed: out of memory
// Kernel launches report errors through ATOLL_CUDA_CHECK_LAUNCH() right after the launch.
#pragma once

#include <sstream>
#include <string>

#include "atoll/backend/cuda/vendor.h"
#include "atoll/core/errors.h"

namespace atl {

class GpuError : public Error {  // no device, out of device memory, a failed launch or BLAS call
 public:
  using Error::Error;
};

namespace gpu {

[[noreturn]] inline void throw_gpu_error(const char* file, int line, const char* call, const std::string& why) {
  std::ostringstream msg;
  msg << file << ":" << line << ": " << call << " failed: " << why;
  throw GpuError(msg.str());
}

}  // namespace gpu
}  // namespace atl

#define ATOLL_CUDA_CHECK(call)                                                                \
  do {                                                                                        \
    const cudaError_t atoll_err_ = (call);                                                    \
    if (atoll_err_ != cudaSuccess)                                                            \
      ::atl::gpu::throw_gpu_error(__FILE__, __LINE__, #call, cudaGetErrorString(atoll_err_)); \
  } while (0)

// After a <<<...>>> launch: configuration errors (too much shared memory, a zero-sized grid)
// surface here; faults inside the kernel surface at the next synchronising call.
#define ATOLL_CUDA_CHECK_LAUNCH() ATOLL_CUDA_CHECK(cudaGetLastError())

#if ATOLL_GPU_HAS_BLAS
#define ATOLL_CUBLAS_CHECK(call)                                                                \
  do {                                                                                          \
    const cublasStatus_t atoll_st_ = (call);                                                    \
    if (atoll_st_ != CUBLAS_STATUS_SUCCESS)                                                     \
      ::atl::gpu::throw_gpu_error(__FILE__, __LINE__, #call, cublasGetStatusString(atoll_st_)); \
  } while (0)
#endif
