// Matrix products on the device, row-major like backend/cpu/gemm.h:
//   C[M,N] = alpha * op(A) * op(B) + beta * C,  op(X) = X or Xᵀ,
// with A and B in fp32 or bf16 and C, the accumulation and alpha/beta in fp32. Layers keep
// weights as [out, in], so the forward pass is trans_b = true and the weight gradient
// trans_a = true. beta = 0 never reads C (it may hold NaN), as in BLAS.
//
// CUDA: cuBLAS (cublasGemmEx / cublasGemmStridedBatchedEx, CUBLAS_COMPUTE_32F: no TF32, so
// fp32 products match the CPU to rounding). A row-major C is a column-major Cᵀ = op(B)ᵀ op(A)ᵀ,
// so the wrapper swaps the operands instead of copying anything. HIP without hipBLAS (Debian's
// ROCm 5.2): the same calls run gemm_tiled below, correct but slow.
#pragma once

#include <cstdint>

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

enum class Dtype { kF32, kBF16 };

class Blas {
 public:
  explicit Blas(cudaStream_t stream = nullptr);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  void set_stream(cudaStream_t stream);
  cudaStream_t stream() const { return stream_; }

  // A, B: `in` elements (float or bf16 bits); C: float.
  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda, const void* B,
            int ldb, float beta, float* C, int ldc, Dtype in = Dtype::kF32);

  // `batch` independent products, matrix i at A + i*stride_a (in elements), likewise B and C:
  // the experts' [E, ...] tensors with equal row counts.
  void gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda,
                            int64_t stride_a, const void* B, int ldb, int64_t stride_b, float beta, float* C, int ldc,
                            int64_t stride_c, int batch, Dtype in = Dtype::kF32);

 private:
  cudaStream_t stream_ = nullptr;
  [[maybe_unused]] void* handle_ = nullptr;  // cublasHandle_t where there is a BLAS
};

// The plain shared-memory tiled kernel (16×16 tiles, fp32 accumulation), with the same
// arguments as Blas::gemm_strided_batched. The HIP build's BLAS, and an independent device
// oracle for the cuBLAS path in tests.
void gemm_tiled(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda, int64_t stride_a,
                const void* B, int ldb, int64_t stride_b, float beta, float* C, int ldc, int64_t stride_c, int batch,
                Dtype in, cudaStream_t stream);

// out[n] (=) in[n] rounded to bf16 (nearest even).
void f32_to_bf16(uint16_t* out, const float* in, size_t n, cudaStream_t stream = nullptr);

}  // namespace atl::gpu
