#include "atoll/layers/blas.h"

#include <cblas.h>

#include <cstddef>

namespace atl {
namespace {

CBLAS_TRANSPOSE op(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

}  // namespace

template <>
void blas_gemm<float>(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                      int ldb, float beta, float* C, int ldc) {
  if (gemm_handle_empty(M, N, K, beta, C, ldc)) return;
  cblas_sgemm(CblasRowMajor, op(ta), op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <>
void blas_gemm<double>(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B,
                       int ldb, double beta, double* C, int ldc) {
  if (gemm_handle_empty(M, N, K, beta, C, ldc)) return;
  cblas_dgemm(CblasRowMajor, op(ta), op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace atl
