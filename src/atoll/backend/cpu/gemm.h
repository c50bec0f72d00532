// Matrix products, row-major: C[M,N] = alpha * op(A) * op(B) + beta * C, where op(X) is X or
// Xᵀ. Layers keep weights as [out, in] (PyTorch/Hugging Face layout), so the forward pass is
// trans_b = true and the weight gradient trans_a = true: transposes are folded into the call,
// never copied. `gemm<float>` goes to oneDNN's sgemm, `gemm<double>` (gradient checks) to
// OpenBLAS; `gemm_reference` is the plain triple loop that every fast path is tested against.
//
// Why oneDNN for fp32: it picks its kernels by instruction set at run time (JIT), so it uses
// the full-width AVX-512 of this Zen 5 machine. Debian's OpenBLAS 0.3.21 runs its AVX2
// "Haswell" kernels here (and this environment pins OPENBLAS_CORETYPE=Haswell): sgemm 2048^3
// measured 231 GFLOP/s through OpenBLAS, 445 through oneDNN. Both share the GNU OpenMP pool.
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
