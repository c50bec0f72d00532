// The matrix product of the reference layers: row-major C[M,N] = alpha * op(A) * op(B) + beta * C
// through the BLAS library itself (OpenBLAS's cblas_sgemm / cblas_dgemm), never through the
// fast kernels of backend/ that the layers are the oracle for (backend/cpu/gemm.h sends fp32
// to oneDNN). Zero-sized products are handled here: BLAS rejects leading dimensions of 0.
#pragma once

namespace atl {

template <typename T>
void blas_gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
               T beta, T* C, int ldc);

}  // namespace atl
