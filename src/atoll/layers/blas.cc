#include "atoll/layers/blas.h"

#include <cblas.h>

#include <cstddef>

namespace atl {
namespace {

// K == 0 still scales C by beta; M == 0 or N == 0 leaves nothing to do.
template <typename T>
bool handle_empty(int M, int N, int K, T beta, T* C, int ldc) {
  if (M == 0 || N == 0) return true;
  if (K > 0) return false;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) C[size_t(i) * ldc + j] = beta == T(0) ? T(0) : beta * C[size_t(i) * ldc + j];
  return true;
}

CBLAS_TRANSPOSE op(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

}  // namespace

template <>
void blas_gemm<float>(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                      int ldb, float beta, float* C, int ldc) {
  if (handle_empty(M, N, K, beta, C, ldc)) return;
  cblas_sgemm(CblasRowMajor, op(ta), op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <>
void blas_gemm<double>(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B,
                       int ldb, double beta, double* C, int ldc) {
  if (handle_empty(M, N, K, beta, C, ldc)) return;
  cblas_dgemm(CblasRowMajor, op(ta), op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace atl
