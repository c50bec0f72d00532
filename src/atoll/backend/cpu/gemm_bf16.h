// bf16 matrix products through oneDNN's matmul primitive: inputs bf16, accumulation and
// output fp32, with the same row-major contract as gemm.h
//   C[M,N] = alpha * op(A) * op(B) + beta * C,  op(X) = X or Xᵀ
// Transposes and leading dimensions become memory strides (nothing is copied); beta != 0 is
// oneDNN's "sum" post-op on the fp32 output, so gradients accumulate (+=) in fp32. Primitives
// are cached per thread by shape, so a product of a shape seen before costs a hash lookup.
// oneDNN runs on the same OpenMP runtime (GNU libgomp) as OpenBLAS and our loops: called
// inside a parallel region it runs single-threaded on the calling thread.
#pragma once

#include <cstddef>

#include "atoll/backend/cpu/bf16.h"

namespace atl {

// C fp32 [M,N] with leading dimension ldc; A, B bf16.
void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda, const bf16* B,
               int ldb, float beta, float* C, int ldc);

// Same with a bf16 output (rounded once from the fp32 accumulator); beta must be 0.
void gemm_bf16_out(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
                   const bf16* B, int ldb, bf16* C, int ldc);

// Batched: for i in [0, batch): C_i = alpha * op(A_i) op(B_i) + beta * C_i, matrices packed
// (A_i = A + i * stride_a, and so on), each with the leading dimensions given.
void gemm_bf16_batched(int batch, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A,
                       int lda, size_t stride_a, const bf16* B, int ldb, size_t stride_b, float beta, float* C,
                       int ldc, size_t stride_c);

// Batched with a bf16 output: C_i = bf16(alpha * op(A_i) op(B_i) + beta * C_i), the sum taken in
// fp32 from the bf16 C_i (so beta != 0 reads C_i as bf16). K must be > 0.
void gemm_bf16_batched_out(int batch, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A,
                           int lda, size_t stride_a, const bf16* B, int ldb, size_t stride_b, float beta, bf16* C,
                           int ldc, size_t stride_c);

// fp32 inputs, rounded to bf16 into per-thread scratch first: the drop-in for gemm<float>
// where the inputs are not already held in bf16 (same signature as gemm<float>).
void gemm_bf16_f32(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                   const float* B, int ldb, float beta, float* C, int ldc);

// Number of distinct shapes this thread has built primitives for (tests, diagnostics).
size_t gemm_bf16_cached_shapes();

}  // namespace atl
