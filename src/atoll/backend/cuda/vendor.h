// The one place where the GPU vendor shows. Every file of backend/cuda/ is written against the
// CUDA runtime and cuBLAS names; compiled as HIP (ATOLL_GPU_HIP, set by the HIP build in
// CMakeLists.txt), this header maps those names onto HIP's, the way ggml's
// ggml/src/ggml-cuda/vendors/hip.h does. There are no generated copies of the sources.
//
// BLAS: Debian's ROCm 5.2 ships no hipBLAS, so the HIP build has ATOLL_GPU_HAS_BLAS = 0 and
// blas.cu runs its own tiled kernel instead. Defining ATOLL_WITH_HIPBLAS maps the few cuBLAS
// names the wrapper uses onto hipBLAS (untested: no such toolchain here).
#pragma once

#if defined(ATOLL_GPU_HIP)

#include <hip/hip_runtime.h>

#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaStream_t hipStream_t
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaMemGetInfo hipMemGetInfo

#if defined(ATOLL_WITH_HIPBLAS)
#include <hipblas/hipblas.h>
#define ATOLL_GPU_HAS_BLAS 1
#define CUBLAS_COMPUTE_32F HIPBLAS_R_32F
#define CUBLAS_GEMM_DEFAULT HIPBLAS_GEMM_DEFAULT
#define CUBLAS_OP_N HIPBLAS_OP_N
#define CUBLAS_OP_T HIPBLAS_OP_T
#define CUBLAS_STATUS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define CUDA_R_16BF HIPBLAS_R_16B
#define CUDA_R_32F HIPBLAS_R_32F
#define cublasCreate hipblasCreate
#define cublasDestroy hipblasDestroy
#define cublasGemmEx hipblasGemmEx
#define cublasGemmStridedBatchedEx hipblasGemmStridedBatchedEx
#define cublasHandle_t hipblasHandle_t
#define cublasOperation_t hipblasOperation_t
#define cublasSetStream hipblasSetStream
#define cublasStatus_t hipblasStatus_t
#define cublasGetStatusString hipblasStatusToString
#else
#define ATOLL_GPU_HAS_BLAS 0
#endif

#else  // CUDA

#include <cublas_v2.h>
#include <cuda_runtime.h>
#define ATOLL_GPU_HAS_BLAS 1

#endif
