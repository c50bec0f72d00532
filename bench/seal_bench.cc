// Sealing's throughput (dist/seal.h, XChaCha20-Poly1305): seal and open of one frame of the
// ring's message sizes, one core. Every size is first sealed and opened back and compared (the
// run aborts if they differ), then timed; bytes_per_second is the plaintext's.
//   build/bench/seal_bench --benchmark_min_time=0.5
// An outer step's cost follows: each island seals what it sends and opens what it receives, about
// twice its comm_bytes per outer step (docs/benchmarks.md "Sealed traffic").
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "atoll/dist/seal.h"

namespace atl {
namespace {

const FrameContext kContext{.group = "atoll/bench/outer-r0/e0", .purpose = SealPurpose::kRing, .sender = 0,
                            .receiver = 1, .round = 1, .seq = 1};

std::vector<uint8_t> bytes(size_t n) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(i * 131 + (i >> 8));
  return b;
}

void require_round_trip(const Sealer& s, const std::vector<uint8_t>& m) {
  std::vector<uint8_t> frame(m.size() + kSealOverhead), back(m.size());
  s.seal(m.data(), m.size(), kContext, frame.data());
  if (!s.try_open(frame.data(), frame.size(), kContext, back.data()) || back != m) {
    std::fprintf(stderr, "seal_bench: a frame of %zu bytes did not open to its plaintext\n", m.size());
    std::abort();
  }
}

void BM_Seal(benchmark::State& state) {
  const Sealer s("bench token");
  const std::vector<uint8_t> m = bytes(size_t(state.range(0)));
  require_round_trip(s, m);
  std::vector<uint8_t> frame(m.size() + kSealOverhead);
  for (auto _ : state) {
    s.seal(m.data(), m.size(), kContext, frame.data());
    benchmark::DoNotOptimize(frame.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
}

void BM_Open(benchmark::State& state) {
  const Sealer s("bench token");
  const std::vector<uint8_t> m = bytes(size_t(state.range(0)));
  require_round_trip(s, m);
  std::vector<uint8_t> frame(m.size() + kSealOverhead), back(m.size());
  s.seal(m.data(), m.size(), kContext, frame.data());
  for (auto _ : state) {
    if (!s.try_open(frame.data(), frame.size(), kContext, back.data())) std::abort();
    benchmark::DoNotOptimize(back.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
}

// 4 KiB: a small ring chunk; 256 KiB: int8 codec bytes of the default 1 MiB fp32 chunk; 1 MiB.
BENCHMARK(BM_Seal)->Arg(4 << 10)->Arg(256 << 10)->Arg(1 << 20);
BENCHMARK(BM_Open)->Arg(4 << 10)->Arg(256 << 10)->Arg(1 << 20);

}  // namespace
}  // namespace atl

BENCHMARK_MAIN();
