// cuBLAS, loaded at its first use instead of at every start of atoll.
//
// Linking libcublas makes the loader map and relocate it and its 540 MB libcublasLt before
// main(): 211 MB of resident memory in every atoll process of a CUDA build, a CPU run's workers,
// `atoll data prepare` and `--version` included (measured: 235 MB against 17 MB without). So
// atoll_cuda does not link cuBLAS; this file defines the six cuBLAS functions blas.cu calls,
// with the header's own declarations (the compiler checks every signature against
// cublas_api.h), and each forwards to the real one, resolved with dlopen/dlsym the first time
// any is called: the pattern of Implib.so's lazy stubs. Only the CUDA build needs it: the HIP
// build calls hipBLAS (or its own kernel) directly.
#include "atoll/backend/cuda/vendor.h"

#if ATOLL_GPU_HAS_BLAS && !defined(ATOLL_GPU_HIP)

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "atoll/backend/cuda/check.h"

#define ATOLL_BLAS_STR2(x) #x
#define ATOLL_BLAS_STR(x) ATOLL_BLAS_STR2(x)

namespace atl::gpu {
namespace {

// The soname the headers were built against (a literal, so that scripts/gpu_kit.sh can read it
// off the binary with grep and list it among the CUDA libraries the host must provide).
constexpr const char* kCublasSoname = "libcublas.so." ATOLL_BLAS_STR(CUBLAS_VER_MAJOR);

void* cublas_handle() {
  static void* handle = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    handle = dlopen(kCublasSoname, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = dlerror();
      throw GpuError(std::string("cannot load cuBLAS (") + kCublasSoname + "): " + (why ? why : "not found") +
                     "; fix: put the CUDA toolkit's library folder on LD_LIBRARY_PATH (e.g. /usr/local/cuda/lib64)");
    }
  });
  return handle;
}

template <typename Fn>
Fn cublas_symbol(const char* name) {
  void* sym = dlsym(cublas_handle(), name);
  if (!sym)
    throw GpuError(std::string(kCublasSoname) + " has no " + name +
                   "; fix: use the cuBLAS of the CUDA toolkit atoll was built with (" + kCublasSoname + ")");
  return reinterpret_cast<Fn>(sym);
}

}  // namespace
}  // namespace atl::gpu

// Each stub resolves its function once (a function-local static) and forwards the call.
#define ATOLL_BLAS_FORWARD(name, ...)                                               \
  using Fn = decltype(&name);                                                       \
  static const Fn real = ::atl::gpu::cublas_symbol<Fn>(ATOLL_BLAS_STR(name));       \
  return real(__VA_ARGS__)

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) { ATOLL_BLAS_FORWARD(cublasCreate_v2, handle); }

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) { ATOLL_BLAS_FORWARD(cublasDestroy_v2, handle); }

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  ATOLL_BLAS_FORWARD(cublasSetStream_v2, handle, stream);
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  ATOLL_BLAS_FORWARD(cublasGetStatusString, status);
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb, const void* beta,
                                         void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                         cublasGemmAlgo_t algo) {
  using Fn = cublasStatus_t(CUBLASWINAPI*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                           const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                                           int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                                           cublasGemmAlgo_t);
  static const Fn real = ::atl::gpu::cublas_symbol<Fn>("cublasGemmEx");
  return real(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc,
              computeType, algo);
}

cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                                       cublasOperation_t transb, int m, int n, int k,
                                                       const void* alpha, const void* A, cudaDataType Atype, int lda,
                                                       long long int strideA, const void* B, cudaDataType Btype,
                                                       int ldb, long long int strideB, const void* beta, void* C,
                                                       cudaDataType Ctype, int ldc, long long int strideC,
                                                       int batchCount, cublasComputeType_t computeType,
                                                       cublasGemmAlgo_t algo) {
  using Fn = cublasStatus_t(CUBLASWINAPI*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                           const void*, const void*, cudaDataType, int, long long int, const void*,
                                           cudaDataType, int, long long int, const void*, void*, cudaDataType, int,
                                           long long int, int, cublasComputeType_t, cublasGemmAlgo_t);
  static const Fn real = ::atl::gpu::cublas_symbol<Fn>("cublasGemmStridedBatchedEx");
  return real(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype,
              ldc, strideC, batchCount, computeType, algo);
}

}  // extern "C"

#endif  // ATOLL_GPU_HAS_BLAS && !ATOLL_GPU_HIP
