#include "atoll/backend/cuda/blas.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"
#include "atoll/core/check.h"

namespace atl::gpu {
namespace {

constexpr int kTile = 16;

__device__ inline float load(const float* p, size_t i) { return p[i]; }
__device__ inline float load(const uint16_t* p, size_t i) { return bf16_to_f32(p[i]); }

// One thread per element of C; the block stages a kTile×kTile tile of op(A) and op(B) in
// shared memory per step along K. Batch index in blockIdx.z.
template <typename In>
__global__ void gemm_tiled_kernel(bool ta, bool tb, int M, int N, int K, float alpha, const In* A, int lda, int64_t sa,
                                  const In* B, int ldb, int64_t sb, float beta, float* C, int ldc, int64_t sc) {
  __shared__ float as[kTile][kTile + 1];
  __shared__ float bs[kTile][kTile + 1];
  A += blockIdx.z * sa;
  B += blockIdx.z * sb;
  C += blockIdx.z * sc;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * kTile + ty, col = blockIdx.x * kTile + tx;
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    const int ka = k0 + tx;  // op(A)[row, ka]
    as[ty][tx] = row < M && ka < K ? load(A, ta ? size_t(ka) * lda + row : size_t(row) * lda + ka) : 0.f;
    const int kb = k0 + ty;  // op(B)[kb, col]
    bs[ty][tx] = kb < K && col < N ? load(B, tb ? size_t(col) * ldb + kb : size_t(kb) * ldb + col) : 0.f;
    __syncthreads();
    for (int kk = 0; kk < kTile; ++kk) acc += as[ty][kk] * bs[kk][tx];
    __syncthreads();
  }
  if (row < M && col < N) {
    float* c = C + size_t(row) * ldc + col;
    *c = beta == 0.f ? alpha * acc : alpha * acc + beta * *c;
  }
}

__global__ void f32_to_bf16_kernel(uint16_t* out, const float* in, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = f32_to_bf16(in[i]);
}

void check_dims(int M, int N, int K, int batch) {
  ATOLL_CHECK(M >= 0 && N >= 0 && K >= 0 && batch >= 0) << "gemm " << M << "x" << N << "x" << K << " batch " << batch;
}

#if ATOLL_GPU_HAS_BLAS
cublasOperation_t op(bool t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; }
auto data_type(Dtype d) { return d == Dtype::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }
#endif

}  // namespace

void gemm_tiled(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda, int64_t stride_a,
                const void* B, int ldb, int64_t stride_b, float beta, float* C, int ldc, int64_t stride_c, int batch,
                Dtype in, cudaStream_t stream) {
  check_dims(M, N, K, batch);
  if (M == 0 || N == 0 || batch == 0) return;
  const dim3 block(kTile, kTile);
  const dim3 grid((N + kTile - 1) / kTile, (M + kTile - 1) / kTile, batch);
  if (in == Dtype::kBF16)
    gemm_tiled_kernel<<<grid, block, 0, stream>>>(trans_a, trans_b, M, N, K, alpha, static_cast<const uint16_t*>(A),
                                                  lda, stride_a, static_cast<const uint16_t*>(B), ldb, stride_b, beta,
                                                  C, ldc, stride_c);
  else
    gemm_tiled_kernel<<<grid, block, 0, stream>>>(trans_a, trans_b, M, N, K, alpha, static_cast<const float*>(A), lda,
                                                  stride_a, static_cast<const float*>(B), ldb, stride_b, beta, C, ldc,
                                                  stride_c);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void f32_to_bf16(uint16_t* out, const float* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<grid_for(n), kBlock, 0, stream>>>(out, in, n);
  ATOLL_CUDA_CHECK_LAUNCH();
}

#if ATOLL_GPU_HAS_BLAS

Blas::Blas(cudaStream_t stream) : stream_(stream) {
  cublasHandle_t h = nullptr;
  ATOLL_CUBLAS_CHECK(cublasCreate(&h));
  handle_ = h;
  set_stream(stream);
}

Blas::~Blas() {
  if (handle_) (void)cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

void Blas::set_stream(cudaStream_t stream) {
  stream_ = stream;
  ATOLL_CUBLAS_CHECK(cublasSetStream(static_cast<cublasHandle_t>(handle_), stream));
}

void Blas::gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda, const void* B,
                int ldb, float beta, float* C, int ldc, Dtype in) {
  check_dims(M, N, K, 1);
  if (M == 0 || N == 0) return;
  // Column-major Cᵀ[N,M] = op(B)ᵀ[N,K] · op(A)ᵀ[K,M]: B first, then A.
  ATOLL_CUBLAS_CHECK(cublasGemmEx(static_cast<cublasHandle_t>(handle_), op(trans_b), op(trans_a), N, M, K, &alpha, B,
                                  data_type(in), ldb, A, data_type(in), lda, &beta, C, CUDA_R_32F, ldc,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void Blas::gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda,
                                int64_t stride_a, const void* B, int ldb, int64_t stride_b, float beta, float* C,
                                int ldc, int64_t stride_c, int batch, Dtype in) {
  check_dims(M, N, K, batch);
  if (M == 0 || N == 0 || batch == 0) return;
  ATOLL_CUBLAS_CHECK(cublasGemmStridedBatchedEx(static_cast<cublasHandle_t>(handle_), op(trans_b), op(trans_a), N, M, K,
                                                &alpha, B, data_type(in), ldb, stride_b, A, data_type(in), lda,
                                                stride_a, &beta, C, CUDA_R_32F, ldc, stride_c, batch,
                                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

#else  // no vendor BLAS in this build: the tiled kernel stands in

Blas::Blas(cudaStream_t stream) : stream_(stream) {}
Blas::~Blas() = default;
void Blas::set_stream(cudaStream_t stream) { stream_ = stream; }

void Blas::gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda, const void* B,
                int ldb, float beta, float* C, int ldc, Dtype in) {
  gemm_tiled(trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, in, stream_);
}

void Blas::gemm_strided_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda,
                                int64_t stride_a, const void* B, int ldb, int64_t stride_b, float beta, float* C,
                                int ldc, int64_t stride_c, int batch, Dtype in) {
  gemm_tiled(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch, in,
             stream_);
}

#endif

}  // namespace atl::gpu
