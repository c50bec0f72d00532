// Throughput measurements, not correctness tests: disabled by default, run with
//   build/tests/dist_throughput_test --gtest_also_run_disabled_tests
// Prints codec encode/decode GB/s (fp32 bytes per second) and the ring all-reduce's algorithm
// bandwidth (buffer bytes / time) on loopback between processes, 1 vs 4 connections.
// ATOLL_BENCH_FLOATS overrides the buffer size (default 1<<24 floats), ATOLL_BENCH_RANKS the
// number of processes (default 2), ATOLL_BENCH_CHUNK the ring's chunk_bytes (default 1 MiB).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "atoll/core/timer.h"
#include "atoll/dist/ring_allreduce.h"
#include "atoll/supervise/redis_server.h"
#include "dist_test_util.h"

namespace atl {
namespace {

const Codec kCodecs[] = {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4};

size_t bench_floats() {
  const char* env = std::getenv("ATOLL_BENCH_FLOATS");
  return env ? std::strtoull(env, nullptr, 10) : size_t{1} << 24;
}

// Best of `reps` timings of fn, in seconds.
template <typename F>
double best_of(int reps, F&& fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_s();
    fn();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

TEST(Throughput, DISABLED_Codecs) {
  const size_t n = bench_floats();
  std::vector<float> x(n), y(n);
  for (size_t i = 0; i < n; ++i) x[i] = testing::test_value(1, 0, i);
  for (Codec c : kCodecs) {
    std::vector<uint8_t> bytes(encoded_bytes(c, n));
    const double gb = 4.0 * n / 1e9;
    const double enc = best_of(5, [&] { encode(c, x.data(), n, bytes.data()); });
    const double dec = best_of(5, [&] { decode(c, bytes.data(), n, y.data()); });
    const double add = best_of(5, [&] { decode_add(c, bytes.data(), n, y.data()); });
    std::printf("codec %-4s  encode %6.2f GB/s  decode %6.2f GB/s  decode_add %6.2f GB/s  (%zu floats, 1 thread)\n",
                codec_name(c), gb / enc, gb / dec, gb / add, n);
  }
}

TEST(Throughput, DISABLED_RingLoopback) {
  const size_t n = bench_floats();
  const int size = std::getenv("ATOLL_BENCH_RANKS") ? std::atoi(std::getenv("ATOLL_BENCH_RANKS")) : 2;
  RedisServer server;
  const auto out = testing::run_processes(size, [&](int rank) {
    Store store(StoreOptions{.url = server.url(), .run_id = "bench"});
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = size, .connections = 4});
    std::vector<float> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = testing::test_value(2, rank, i);
    std::string report;
    for (Codec c : kCodecs)
      for (int conns : {1, 4}) {
        const char* chunk = std::getenv("ATOLL_BENCH_CHUNK");
        RingAllreduce ring(g, RingOptions{.codec = c,
                                          .chunk_bytes = chunk ? std::strtoull(chunk, nullptr, 10) : size_t{1} << 20,
                                          .connections = conns});
        ring.mean(data.data(), n);  // warm-up: page faults, TCP windows
        const double t = best_of(3, [&] { ring.mean(data.data(), n); });
        char line[200];
        std::snprintf(
            line, sizeof(line),
            "ring %-4s conns %d: %7.1f ms  algbw %6.2f GB/s  (wire %6.2f GB/s per rank, codec %.0f%% of thread time)\n",
            codec_name(c), conns, t * 1e3, 4.0 * n / t / 1e9, ring.stats().bytes_sent / 4.0 / t / 1e9,
            100.0 * ring.stats().codec_seconds / (ring.stats().seconds * conns));
        report += line;
      }
    const double t = best_of(3, [&] { g.allreduce_sum(data.data(), n); });
    char line[200];
    std::snprintf(line, sizeof(line),
                  "gloo allreduce_sum (fp32, 4 conns, 16 MiB buckets): %7.1f ms  algbw %6.2f GB/s\n", t * 1e3,
                  4.0 * n / t / 1e9);
    return report + line;
  });
  std::printf("%d ranks, %zu floats on loopback:\n%s", size, n, out[0].c_str());
}

}  // namespace
}  // namespace atl
