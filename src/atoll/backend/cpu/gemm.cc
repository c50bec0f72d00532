#include "atoll/backend/cpu/gemm.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstddef>

#include "atoll/core/check.h"
#include "atoll/layers/blas.h"

namespace atl {

template <>
void gemm<float>(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
                 float beta, float* C, int ldc) {
  if (gemm_handle_empty(M, N, K, beta, C, ldc)) return;
  const dnnl_status_t status = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  ATOLL_CHECK(status == dnnl_success) << "dnnl_sgemm " << M << "x" << N << "x" << K << " status " << int(status);
}

template <>
void gemm<double>(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B,
                  int ldb, double beta, double* C, int ldc) {
  if (gemm_handle_empty(M, N, K, beta, C, ldc)) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

template <typename T>
void gemm_reference(bool ta, bool tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb, T beta,
                    T* C, int ldc) {
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double acc = 0.0;
      for (int k = 0; k < K; ++k) {
        const T a = ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k];
        const T b = tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j];
        acc += double(a) * double(b);
      }
      T& c = C[size_t(i) * ldc + j];
      c = T(alpha * acc + (beta == T(0) ? 0.0 : double(beta) * c));
    }
  }
}

template void gemm_reference<float>(bool, bool, int, int, int, float, const float*, int, const float*, int, float,
                                    float*, int);
template void gemm_reference<double>(bool, bool, int, int, int, double, const double*, int, const double*, int, double,
                                     double*, int);

void set_blas_threads(int n) { openblas_set_num_threads(n); }

}  // namespace atl
