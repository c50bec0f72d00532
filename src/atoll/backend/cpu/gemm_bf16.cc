#include "atoll/backend/cpu/gemm_bf16.h"

#include <immintrin.h>
#include <omp.h>

#include <array>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "atoll/core/check.h"

namespace atl {

// ---- conversions -------------------------------------------------------------------------

namespace {

// Elements below which a conversion is not worth waking the OpenMP team.
constexpr size_t kParallelMin = size_t(1) << 15;

void to_bf16_serial(bf16* out, const float* in, size_t n) {
  size_t i = 0;
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(in + i), hi = _mm512_loadu_ps(in + i + 16);
    const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);  // lanes 0-15 from lo, 16-31 from hi
    _mm512_storeu_si512(out + i, reinterpret_cast<const __m512i&>(v));
  }
#endif
  for (; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

// A shift per element; the compiler vectorises it.
void from_bf16_serial(float* out, const bf16* in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

}  // namespace

void to_bf16(bf16* out, const float* in, size_t n) {
  if (n < kParallelMin || omp_in_parallel()) return to_bf16_serial(out, in, n);
#pragma omp parallel
  {
    const size_t nt = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
    const size_t chunk = ((n + nt - 1) / nt + 31) / 32 * 32, b = std::min(n, t * chunk), e = std::min(n, b + chunk);
    to_bf16_serial(out + b, in + b, e - b);
  }
}

void from_bf16(float* out, const bf16* in, size_t n) {
  if (n < kParallelMin || omp_in_parallel()) return from_bf16_serial(out, in, n);
#pragma omp parallel
  {
    const size_t nt = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
    const size_t chunk = ((n + nt - 1) / nt + 15) / 16 * 16, b = std::min(n, t * chunk), e = std::min(n, b + chunk);
    from_bf16_serial(out + b, in + b, e - b);
  }
}

void to_bf16_2d(bf16* out, const float* in, int rows, int cols, int ld) {
  if (ld == cols) return to_bf16(out, in, size_t(rows) * cols);
  const bool par = size_t(rows) * cols >= kParallelMin && !omp_in_parallel();
#pragma omp parallel for if (par)
  for (int r = 0; r < rows; ++r) to_bf16_serial(out + size_t(r) * cols, in + size_t(r) * ld, size_t(cols));
}

// ---- oneDNN matmul -----------------------------------------------------------------------

namespace {

using dnnl::memory;
using Dt = memory::data_type;

dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// Everything that decides the primitive: shapes, strides, scalars and output type.
struct Key {
  std::array<int64_t, 13> v;
  bool operator==(const Key& o) const { return v == o.v; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ uint64_t(x)) * 1099511628211ull;
    return size_t(h);
  }
};

// A ready primitive with its memory objects, re-pointed at the caller's buffers on each call.
struct Entry {
  dnnl::matmul prim;
  memory a, b, c, scratch;
  size_t scratch_bytes = 0;
};

// Per-thread state: stream, primitive cache, scratchpad. Primitives are built with a user
// scratchpad so that threads running products at once (attention tiles, Muon) never share one.
struct ThreadState {
  dnnl::stream stream{cpu_engine()};
  std::unordered_map<Key, Entry, KeyHash> cache;
  std::vector<uint8_t> scratch;
};
ThreadState& thread_state() {
  static thread_local ThreadState s;
  return s;
}

// Shapes that vary every step (the rows routed to each expert) would grow the cache without
// bound over a long run; past this many it is dropped and rebuilt (oneDNN's own primitive
// cache still holds the recent ones, so a rebuild is cheap).
constexpr size_t kMaxCached = 4096;

struct Problem {
  int batch;
  bool ta, tb;
  int M, N, K;
  float alpha, beta;
  int lda, ldb, ldc;
  size_t sa, sb, sc;
  Dt c_type;
};

Entry& entry_for(const Problem& p) {
  ThreadState& ts = thread_state();
  int32_t alpha_bits, beta_bits;
  std::memcpy(&alpha_bits, &p.alpha, 4);
  std::memcpy(&beta_bits, &p.beta, 4);
  const Key key{{p.batch, int64_t(p.ta) | int64_t(p.tb) << 1 | int64_t(p.c_type == Dt::bf16) << 2, p.M, p.N, p.K,
                 p.lda, p.ldb, p.ldc, int64_t(p.sa), int64_t(p.sb), int64_t(p.sc), alpha_bits, beta_bits}};
  auto it = ts.cache.find(key);
  if (it != ts.cache.end()) return it->second;
  if (ts.cache.size() >= kMaxCached) ts.cache.clear();

  // Row-major views with the transposes folded into the strides: A stored [K,M] when
  // transposed is the [M,K] matrix with strides (1, lda); likewise B.
  const memory::dims a_str = p.ta ? memory::dims{1, p.lda} : memory::dims{p.lda, 1};
  const memory::dims b_str = p.tb ? memory::dims{1, p.ldb} : memory::dims{p.ldb, 1};
  const memory::dims c_str{p.ldc, 1};
  memory::desc ad, bd, cd;
  if (p.batch == 1) {
    ad = memory::desc({p.M, p.K}, Dt::bf16, a_str);
    bd = memory::desc({p.K, p.N}, Dt::bf16, b_str);
    cd = memory::desc({p.M, p.N}, p.c_type, c_str);
  } else {
    auto with_batch = [](memory::dim s, const memory::dims& st) { return memory::dims{s, st[0], st[1]}; };
    ad = memory::desc({p.batch, p.M, p.K}, Dt::bf16, with_batch(memory::dim(p.sa), a_str));
    bd = memory::desc({p.batch, p.K, p.N}, Dt::bf16, with_batch(memory::dim(p.sb), b_str));
    cd = memory::desc({p.batch, p.M, p.N}, p.c_type, with_batch(memory::dim(p.sc), c_str));
  }
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (p.alpha != 1.0f) attr.set_output_scales(0, {p.alpha});
  if (p.beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(p.beta);
    attr.set_post_ops(po);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), attr, cpu_engine());
  Entry e;
  e.prim = dnnl::matmul(pd);
  e.a = memory(ad, cpu_engine(), nullptr);
  e.b = memory(bd, cpu_engine(), nullptr);
  e.c = memory(cd, cpu_engine(), nullptr);
  e.scratch_bytes = pd.scratchpad_desc().get_size();
  e.scratch = memory(pd.scratchpad_desc(), cpu_engine(), nullptr);
  return ts.cache.emplace(key, std::move(e)).first->second;
}

void run(const Problem& p, const bf16* A, const bf16* B, void* C) {
  Entry& e = entry_for(p);
  ThreadState& ts = thread_state();
  if (ts.scratch.size() < e.scratch_bytes) ts.scratch.resize(e.scratch_bytes);
  e.a.set_data_handle(const_cast<bf16*>(A));
  e.b.set_data_handle(const_cast<bf16*>(B));
  e.c.set_data_handle(C);
  e.scratch.set_data_handle(ts.scratch.data());
  e.prim.execute(ts.stream, {{DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c},
                             {DNNL_ARG_SCRATCHPAD, e.scratch}});
  ts.stream.wait();
}

// Zero-sized products: nothing to do, or (K == 0) C = beta * C.
bool handle_empty(int M, int N, int K, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return true;
  if (K > 0) return false;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) C[size_t(i) * ldc + j] = beta == 0.0f ? 0.0f : beta * C[size_t(i) * ldc + j];
  return true;
}

}  // namespace

void gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const bf16* A, int lda, const bf16* B, int ldb,
               float beta, float* C, int ldc) {
  if (handle_empty(M, N, K, beta, C, ldc)) return;
  run({1, ta, tb, M, N, K, alpha, beta, lda, ldb, ldc, 0, 0, 0, Dt::f32}, A, B, C);
}

void gemm_bf16_out(bool ta, bool tb, int M, int N, int K, float alpha, const bf16* A, int lda, const bf16* B, int ldb,
                   bf16* C, int ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int i = 0; i < M; ++i) std::memset(C + size_t(i) * ldc, 0, sizeof(bf16) * N);
    return;
  }
  run({1, ta, tb, M, N, K, alpha, 0.0f, lda, ldb, ldc, 0, 0, 0, Dt::bf16}, A, B, C);
}

void gemm_bf16_batched(int batch, bool ta, bool tb, int M, int N, int K, float alpha, const bf16* A, int lda,
                       size_t stride_a, const bf16* B, int ldb, size_t stride_b, float beta, float* C, int ldc,
                       size_t stride_c) {
  if (batch == 0) return;
  if (M == 0 || N == 0 || K == 0) {
    for (int i = 0; i < batch; ++i) handle_empty(M, N, 0, beta, C + i * stride_c, ldc);
    return;
  }
  run({batch, ta, tb, M, N, K, alpha, beta, lda, ldb, ldc, stride_a, stride_b, stride_c, Dt::f32}, A, B, C);
}

void gemm_bf16_batched_out(int batch, bool ta, bool tb, int M, int N, int K, float alpha, const bf16* A, int lda,
                           size_t stride_a, const bf16* B, int ldb, size_t stride_b, float beta, bf16* C, int ldc,
                           size_t stride_c) {
  ATOLL_CHECK_GT(K, 0);
  if (batch == 0 || M == 0 || N == 0) return;
  run({batch, ta, tb, M, N, K, alpha, beta, lda, ldb, ldc, stride_a, stride_b, stride_c, Dt::bf16}, A, B, C);
}

void gemm_bf16_f32(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                   int ldb, float beta, float* C, int ldc) {
  if (handle_empty(M, N, K, beta, C, ldc)) return;
  static thread_local std::vector<bf16> a16, b16;
  // Packed in their stored orientation: [M,K] or, transposed, [K,M].
  const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  a16.resize(size_t(a_rows) * a_cols);
  b16.resize(size_t(b_rows) * b_cols);
  to_bf16_2d(a16.data(), A, a_rows, a_cols, lda);
  to_bf16_2d(b16.data(), B, b_rows, b_cols, ldb);
  gemm_bf16(ta, tb, M, N, K, alpha, a16.data(), a_cols, b16.data(), b_cols, beta, C, ldc);
}

size_t gemm_bf16_cached_shapes() { return thread_state().cache.size(); }

}  // namespace atl
