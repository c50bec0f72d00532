// backend/cuda/blas.cu (cuBLAS and the tiled kernel) against backend/cpu's gemm_reference.
#include "atoll/backend/cuda/blas.h"

#include "atoll/backend/cpu/gemm.h"
#include "atoll/backend/cuda/arena.h"
#include "atoll/backend/cuda/bf16.h"
#include "gpu_test_util.h"

#include <fstream>
#include <string>

namespace atl {
namespace {

using test::DeviceVec;
using test::randn_f;

struct Case {
  bool ta, tb;
  int M, N, K;
};
// Every transpose combination; sizes not multiples of the 16-wide tile; K = 1; a long K.
constexpr Case kCases[] = {{false, false, 1, 1, 1},  {false, true, 17, 33, 5},  {true, false, 31, 7, 65},
                           {true, true, 16, 16, 16}, {false, true, 70, 3, 513}, {false, false, 5, 129, 1}};

// Matrices in their stored (row-major) shape given the transpose flags.
struct Operands {
  int lda, ldb, ldc;
  std::vector<float> a, b, c;
};
Operands make(const Case& k, Rng& rng) {
  Operands o;
  o.lda = k.ta ? k.M : k.K;
  o.ldb = k.tb ? k.K : k.N;
  o.ldc = k.N;
  o.a = randn_f(rng, size_t(k.M) * k.K);
  o.b = randn_f(rng, size_t(k.K) * k.N);
  o.c = randn_f(rng, size_t(k.M) * k.N);
  return o;
}

// fp32 inputs, fp32 accumulation (no TF32): the products differ from the serial CPU loop only
// in summation order, |err| <= K·eps·Σ|a||b| ~ K·6e-8·sqrt(K) for unit normals, so
// 1e-5·(1 + K/64) absolute + 1e-5 relative.
// cuBLAS is loaded at its first use (blas_library.cu), never at start: linking it costs every
// atoll process 211 MB of resident memory before main(). Runs without a GPU.
TEST(CudaBlas, CublasIsNotLoadedBeforeItsFirstUse) {
  std::ifstream maps("/proc/self/maps");
  ASSERT_TRUE(maps.good());
  std::string line;
  while (std::getline(maps, line)) EXPECT_EQ(line.find("libcublas"), std::string::npos) << line;
}

TEST(CudaBlas, Fp32GemmMatchesReference) {
  ATOLL_SKIP_WITHOUT_GPU();
  gpu::Blas blas;
  for (const Case& k : kCases) {
    SCOPED_TRACE(testing::Message() << "ta=" << k.ta << " tb=" << k.tb << " " << k.M << "x" << k.N << "x" << k.K);
    Rng rng(k.M * 1000 + k.N * 10 + k.K);
    const Operands o = make(k, rng);
    for (const float beta : {0.f, 0.5f}) {
      std::vector<float> want = o.c;
      gemm_reference<float>(k.ta, k.tb, k.M, k.N, k.K, 1.5f, o.a.data(), o.lda, o.b.data(), o.ldb, beta, want.data(),
                            o.ldc);
      DeviceVec<float> d_a(o.a), d_b(o.b), d_c(o.c), d_t(o.c);
      if (beta == 0.f) {  // beta = 0 must not read C
        d_c.fill_nan();
        d_t.fill_nan();
      }
      blas.gemm(k.ta, k.tb, k.M, k.N, k.K, 1.5f, d_a.get(), o.lda, d_b.get(), o.ldb, beta, d_c.get(), o.ldc);
      gpu::gemm_tiled(k.ta, k.tb, k.M, k.N, k.K, 1.5f, d_a.get(), o.lda, 0, d_b.get(), o.ldb, 0, beta, d_t.get(), o.ldc,
                      0, 1, gpu::Dtype::kF32, nullptr);
      const double atol = 1e-5 * (1.0 + k.K / 64.0);
      test::expect_near(d_c.host(), want, atol, 1e-5, "blas");
      test::expect_near(d_t.host(), want, atol, 1e-5, "tiled");
    }
  }
}

// bf16 inputs: the reference multiplies the same bf16-rounded values in fp32, so only the
// summation order differs, as above. (Against unrounded inputs the error would be ~2^-8.)
TEST(CudaBlas, Bf16GemmMatchesReferenceOnRoundedInputs) {
  ATOLL_SKIP_WITHOUT_GPU();
  gpu::Blas blas;
  for (const Case& k : kCases) {
    SCOPED_TRACE(testing::Message() << "ta=" << k.ta << " tb=" << k.tb << " " << k.M << "x" << k.N << "x" << k.K);
    Rng rng(k.M + k.N + k.K);
    Operands o = make(k, rng);
    for (auto* v : {&o.a, &o.b})
      for (auto& x : *v) x = gpu::bf16_to_f32(gpu::f32_to_bf16(x));
    std::vector<float> want(o.c.size());
    gemm_reference<float>(k.ta, k.tb, k.M, k.N, k.K, 1.f, o.a.data(), o.lda, o.b.data(), o.ldb, 0.f, want.data(),
                          o.ldc);
    DeviceVec<float> d_a(o.a), d_b(o.b), d_c(o.c.size()), d_t(o.c.size());
    DeviceVec<uint16_t> h_a(o.a.size()), h_b(o.b.size());
    gpu::f32_to_bf16(h_a.get(), d_a.get(), o.a.size());
    gpu::f32_to_bf16(h_b.get(), d_b.get(), o.b.size());
    blas.gemm(k.ta, k.tb, k.M, k.N, k.K, 1.f, h_a.get(), o.lda, h_b.get(), o.ldb, 0.f, d_c.get(), o.ldc,
              gpu::Dtype::kBF16);
    gpu::gemm_tiled(k.ta, k.tb, k.M, k.N, k.K, 1.f, h_a.get(), o.lda, 0, h_b.get(), o.ldb, 0, 0.f, d_t.get(), o.ldc, 0,
                    1, gpu::Dtype::kBF16, nullptr);
    const double atol = 1e-5 * (1.0 + k.K / 64.0);
    test::expect_near(d_c.host(), want, atol, 1e-5, "blas bf16");
    test::expect_near(d_t.host(), want, atol, 1e-5, "tiled bf16");
  }
}

// Three experts' products in one call, against three reference calls.
TEST(CudaBlas, StridedBatchedMatchesPerMatrixReference) {
  ATOLL_SKIP_WITHOUT_GPU();
  gpu::Blas blas;
  const int E = 3, M = 19, N = 23, K = 37;  // C[e] = A[e] · B[e]ᵀ, as an expert's forward
  Rng rng(5);
  const auto a = randn_f(rng, size_t(E) * M * K), b = randn_f(rng, size_t(E) * N * K);
  std::vector<float> want(size_t(E) * M * N);
  for (int e = 0; e < E; ++e)
    gemm_reference<float>(false, true, M, N, K, 1.f, a.data() + size_t(e) * M * K, K, b.data() + size_t(e) * N * K, K,
                          0.f, want.data() + size_t(e) * M * N, N);
  DeviceVec<float> d_a(a), d_b(b), d_c(want.size()), d_t(want.size());
  blas.gemm_strided_batched(false, true, M, N, K, 1.f, d_a.get(), K, int64_t(M) * K, d_b.get(), K, int64_t(N) * K, 0.f,
                            d_c.get(), N, int64_t(M) * N, E);
  gpu::gemm_tiled(false, true, M, N, K, 1.f, d_a.get(), K, int64_t(M) * K, d_b.get(), K, int64_t(N) * K, 0.f, d_t.get(),
                  N, int64_t(M) * N, E, gpu::Dtype::kF32, nullptr);
  test::expect_near(d_c.host(), want, 2e-5, 1e-5, "blas batched");
  test::expect_near(d_t.host(), want, 2e-5, 1e-5, "tiled batched");
}

TEST(CudaArena, AllocatesAlignedAndThrowsWhenFull) {
  ATOLL_SKIP_WITHOUT_GPU();
  gpu::DeviceArena arena(4096);
  float* a = arena.alloc<float>(3);
  const size_t m = arena.mark();
  float* b = arena.alloc<float>(5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % gpu::DeviceArena::kAlign, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % gpu::DeviceArena::kAlign, 0u);
  EXPECT_EQ(b - a, 64);  // 12 bytes rounded up to 256
  EXPECT_THROW(arena.alloc<float>(4096), GpuError);
  arena.release(m);
  EXPECT_EQ(arena.alloc<float>(1), b);
  EXPECT_THROW(arena.release(arena.used() + 1), CheckError);
}

}  // namespace
}  // namespace atl
