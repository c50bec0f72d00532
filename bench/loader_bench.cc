// Tokens per second the training data loader delivers (bench/loader_throughput.sh compares them
// with what a training step consumes). Shards are written once into $ATOLL_LOADER_BENCH_DIR
// (default /tmp/atoll-loader-bench): 3 datasets of 2 shards of 8 M uint16 tokens each, so the
// windows of a shuffled epoch land all over 96 MB of mapped files. The loader runs as in
// training: shuffled, with its background prefetch, the step's consumer being the copy out.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "atoll/data/mixture_loader.h"
#include "atoll/data/shard.h"

namespace atl {
namespace {

constexpr int kShards = 2, kDatasets = 3;
constexpr int64_t kShardTokens = 8'000'000;

std::string bench_root() {
  const char* d = std::getenv("ATOLL_LOADER_BENCH_DIR");
  return d && *d ? d : "/tmp/atoll-loader-bench";
}

// Dataset d's folder, its shards written on first use.
std::string dataset(int d) {
  const std::string dir = bench_root() + "/ds" + std::to_string(d);
  std::filesystem::create_directories(dir);
  for (int s = 0; s < kShards; ++s) {
    const std::string path = dir + "/train_00000" + std::to_string(s) + ".bin";
    if (std::filesystem::exists(path)) continue;
    std::vector<int32_t> tokens(kShardTokens);
    for (int64_t i = 0; i < kShardTokens; ++i) tokens[size_t(i)] = int32_t((i * 7919 + d * 31 + s) % 32000);
    write_shard(path, tokens);
  }
  return dir;
}

// state.range(0) = T, range(1) = B, range(2) = datasets in the mixture (1: the plain loader).
void BM_Loader(benchmark::State& state) {
  const int T = int(state.range(0)), B = int(state.range(1)), n = int(state.range(2));
  DataPhase phase;
  for (int d = 0; d < n; ++d) phase.mix.push_back({dataset(d), double(d + 1)});
  MixtureLoader loader({phase}, "train", {.seq_len = T, .seed = 1});
  loader.enter_phase(0);
  std::vector<int32_t> x(size_t(B) * T), y(size_t(B) * T);
  for (auto _ : state) {
    loader.next_batch(B, x.data(), y.data());
    benchmark::DoNotOptimize(x.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["tokens_per_s"] = benchmark::Counter(double(state.iterations()) * B * T, benchmark::Counter::kIsRate);
}

BENCHMARK(BM_Loader)
    ->ArgNames({"T", "B", "datasets"})
    ->Args({128, 8, 1})
    ->Args({128, 8, kDatasets})
    ->Args({1024, 8, 1})
    ->Args({1024, 8, kDatasets})
    ->Args({4096, 16, kDatasets})
    ->UseRealTime();

}  // namespace
}  // namespace atl

BENCHMARK_MAIN();
