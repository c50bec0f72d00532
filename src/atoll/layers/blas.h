// The matrix product of the reference layers: row-major C[M,N] = alpha * op(A) * op(B) + beta * C
// through the BLAS library itself (OpenBLAS's cblas_sgemm / cblas_dgemm), never through the
// fast kernels of backend/ that the layers are the oracle for (backend/cpu/gemm.h sends fp32
// to oneDNN). Zero-sized products are handled here: BLAS rejects leading dimensions of 0.
#pragma once

#include <cstddef>

namespace atl {

// The products BLAS routines reject: M == 0 or N == 0 leaves nothing to do, K == 0 only scales
// C by beta. Returns true when it handled the product (also used by backend/cpu/gemm.cc).
template <typename T>
inline bool gemm_handle_empty(int M, int N, int K, T beta, T* C, int ldc) {
  if (M == 0 || N == 0) return true;
  if (K > 0) return false;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) C[size_t(i) * ldc + j] = beta == T(0) ? T(0) : beta * C[size_t(i) * ldc + j];
  return true;
}

template <typename T>
void blas_gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
               T beta, T* C, int ldc);

}  // namespace atl
