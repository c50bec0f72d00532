// Per-kernel benchmarks. Every fast variant is first checked against the plain reference on
// the benchmark's own inputs (the run aborts if they disagree), then timed.
//   build/bench/kernels_bench --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "atoll/backend/cpu/attention.h"
#include "atoll/backend/cpu/gemm.h"
#include "atoll/backend/cpu/gemm_bf16.h"
#include "atoll/core/rng.h"
#include "atoll/layers/attention.h"
#include "atoll/optim/muon.h"

namespace atl {
namespace {

std::vector<float> randn(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = float(rng.normal());
  return x;
}

void require_close(const std::vector<float>& a, const std::vector<float>& b, double tol, const char* what) {
  double worst = 0, scale = 1;
  for (float x : a) scale = std::max(scale, double(std::abs(x)));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]) / scale);
  if (worst > tol) {
    std::fprintf(stderr, "%s: fast kernel differs from the reference by %.3g (tolerance %.3g)\n", what, worst, tol);
    std::abort();
  }
}

// Matrix product as the model uses it: out[M,N] = a[M,K] · b[N,K]ᵀ.
void BM_GemmNT(benchmark::State& st) {
  const int M = int(st.range(0)), N = int(st.range(1)), K = int(st.range(2));
  auto a = randn(size_t(M) * K, 1), b = randn(size_t(N) * K, 2);
  std::vector<float> c(size_t(M) * N), ref(size_t(M) * N);
  if (size_t(M) * N * K <= (size_t(1) << 27)) {
    gemm<float>(false, true, M, N, K, 1.f, a.data(), K, b.data(), K, 0.f, c.data(), N);
    gemm_reference<float>(false, true, M, N, K, 1.f, a.data(), K, b.data(), K, 0.f, ref.data(), N);
    require_close(ref, c, 1e-4, "gemm");
  }
  for (auto _ : st) gemm<float>(false, true, M, N, K, 1.f, a.data(), K, b.data(), K, 0.f, c.data(), N);
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * N * K, benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}
BENCHMARK(BM_GemmNT)->Args({4096, 512, 512})->Args({1024, 1024, 512})->Args({4096, 8192, 512})->Args({2048, 2048, 2048})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

// The same products in bf16 (oneDNN; inputs already bf16, fp32 output), checked against the
// double reference on the bf16-rounded inputs: then only fp32 accumulation differs (1e-4).
// Also the conversion of one fp32 operand, the cost gemm_bf16_f32 adds per call.
void BM_GemmNTBf16(benchmark::State& st) {
  const int M = int(st.range(0)), N = int(st.range(1)), K = int(st.range(2));
  auto a = randn(size_t(M) * K, 1), b = randn(size_t(N) * K, 2);
  std::vector<bf16> a16(a.size()), b16(b.size());
  to_bf16(a16.data(), a.data(), a.size());
  to_bf16(b16.data(), b.data(), b.size());
  from_bf16(a.data(), a16.data(), a.size());
  from_bf16(b.data(), b16.data(), b.size());
  std::vector<float> c(size_t(M) * N), ref(size_t(M) * N);
  if (size_t(M) * N * K <= (size_t(1) << 27)) {
    gemm_bf16(false, true, M, N, K, 1.f, a16.data(), K, b16.data(), K, 0.f, c.data(), N);
    gemm_reference<float>(false, true, M, N, K, 1.f, a.data(), K, b.data(), K, 0.f, ref.data(), N);
    require_close(ref, c, 1e-4, "gemm_bf16");
  }
  for (auto _ : st) gemm_bf16(false, true, M, N, K, 1.f, a16.data(), K, b16.data(), K, 0.f, c.data(), N);
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * N * K, benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}
BENCHMARK(BM_GemmNTBf16)->Args({4096, 512, 512})->Args({1024, 1024, 512})->Args({4096, 8192, 512})
    ->Args({2048, 2048, 2048})->Unit(benchmark::kMillisecond)->UseRealTime();

// fp32 -> bf16 of an [R,H] activation of the small config (8192 x 1024).
void BM_ToBf16(benchmark::State& st) {
  const size_t n = size_t(st.range(0));
  auto x = randn(n, 3);
  std::vector<bf16> h(n);
  for (auto _ : st) to_bf16(h.data(), x.data(), n);
  st.counters["GB/s"] = benchmark::Counter(6.0 * n, benchmark::Counter::kIsIterationInvariantRate,
                                           benchmark::Counter::kIs1000);
}
BENCHMARK(BM_ToBf16)->Arg(8192 * 1024)->Unit(benchmark::kMillisecond)->UseRealTime();

// Causal attention of the small config: B=8, T=512, NH=8, HD=64; forward + backward.
void BM_Attention(benchmark::State& st) {
  const bool blocked = st.range(0) != 0;
  const int B = 8, T = int(st.range(1)), NH = 8, NKV = 8, HD = 64;
  const size_t n = size_t(B) * T * NH * HD;
  auto q = randn(n, 1), k = randn(n, 2), v = randn(n, 3), dout = randn(n, 4);
  std::vector<float> o(n), lse(size_t(B) * NH * T), dq(n), dk(n), dv(n), o_ref(n), lse_ref(lse.size());
  attention_forward(o_ref.data(), lse_ref.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD);
  attention_forward_blocked(o.data(), lse.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD);
  require_close(o_ref, o, 1e-4, "attention forward");
  for (auto _ : st) {
    if (blocked) {
      attention_forward_blocked(o.data(), lse.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD);
      attention_backward_blocked(dq.data(), dk.data(), dv.data(), dout.data(), o.data(), lse.data(), q.data(),
                                 k.data(), v.data(), B, T, NH, NKV, HD);
    } else {
      attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, HD);
      attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), o.data(), lse.data(), q.data(), k.data(),
                         v.data(), B, T, NH, NKV, HD);
    }
  }
  // Useful FLOPs: the causal half of QKᵀ and PV forward, twice that backward (12·T·HD·T/2 per head).
  st.counters["GFLOP/s"] = benchmark::Counter(6.0 * B * NH * double(T) * T * HD,
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Attention)->ArgNames({"blocked", "T"})->Args({0, 512})->Args({1, 512})->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Muon's Newton-Schulz on an expert matrix of the small config [1024, 512].
void BM_NewtonSchulz(benchmark::State& st) {
  const int rows = int(st.range(0)), cols = int(st.range(1));
  auto g = randn(size_t(rows) * cols, 5);
  std::vector<float> out(g.size());
  for (auto _ : st) newton_schulz(out.data(), g.data(), rows, cols, 5);
  const double m = std::min(rows, cols), n = std::max(rows, cols);
  st.counters["GFLOP/s"] = benchmark::Counter(5 * (4 * m * m * n + 2 * m * m * m),
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}
BENCHMARK(BM_NewtonSchulz)->Args({1024, 512})->Args({512, 512})->Unit(benchmark::kMillisecond)->UseRealTime();

// The batched bf16 Newton-Schulz on `count` matrices at once (8 = one layer's experts of w1
// in the small config), checked against the fp32 iteration first (muon_test.cc's tolerance).
void BM_NewtonSchulzBf16(benchmark::State& st) {
  const int count = int(st.range(0)), rows = int(st.range(1)), cols = int(st.range(2));
  const size_t n = size_t(rows) * cols;
  auto g = randn(count * n, 5);
  std::vector<float> out(g.size()), ref(n);
  MuonWorkspace ws;
  newton_schulz_bf16(out.data(), g.data(), count, rows, cols, 5, &ws);
  newton_schulz(ref.data(), g.data(), rows, cols, 5);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) diff += std::pow(double(out[i]) - ref[i], 2), norm += double(ref[i]) * ref[i];
  if (!(std::sqrt(diff / norm) < 0.06)) {
    std::fprintf(stderr, "newton_schulz_bf16: relative difference %.3g from fp32 (tolerance 0.06)\n",
                 std::sqrt(diff / norm));
    std::abort();
  }
  for (auto _ : st) newton_schulz_bf16(out.data(), g.data(), count, rows, cols, 5, &ws);
  const double m = std::min(rows, cols), k = std::max(rows, cols);
  st.counters["GFLOP/s"] = benchmark::Counter(count * 5 * (4 * m * m * k + 2 * m * m * m),
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}
BENCHMARK(BM_NewtonSchulzBf16)->ArgNames({"count", "rows", "cols"})->Args({8, 1024, 512})->Args({16, 512, 512})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace atl

BENCHMARK_MAIN();
