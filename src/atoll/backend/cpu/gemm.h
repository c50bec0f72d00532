// Matrix products, row-major: C[M,N] = alpha * op(A) * op(B) + beta * C, where op(X) is X or
// Xᵀ. Layers keep weights as [out, in] (PyTorch/Hugging Face layout), so the forward pass is
// trans_b = true and the weight gradient trans_a = true: transposes are folded into the call,
// never copied. `gemm` goes to the BLAS (OpenBLAS); `gemm_reference` is the plain triple loop
// that every fast path is tested against.
#pragma once

namespace atl {

template <typename T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
          T beta, T* C, int ldc);

template <typename T>
void gemm_reference(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
                    int ldb, T beta, T* C, int ldc);

// Number of threads the BLAS uses (set once at start, so OpenMP and BLAS share the cores).
void set_blas_threads(int n);

}  // namespace atl
