// `atoll bench`: throughput of full training steps (forward, backward, clip, optimizer) on
// synthetic tokens, the time of each phase, and MFU against this machine's measured
// matrix-multiply peak. The FLOP count is the peer's formula (model.h flops_per_token).
#pragma once

#include <nlohmann/json.hpp>

#include "atoll/config/config.h"

namespace atl {

struct BenchOptions {
  int warmup = 1;
  int steps = 3;
  bool measure_peak = true;
};

struct PeakResult {
  double gflops = 0;
  std::string method;
};

// Best of `reps` fp32 BLAS products of size n×n×n on the configured threads.
PeakResult measure_matmul_peak(int n = 2048, int reps = 5);
// Best of `reps` bf16 oneDNN products (bf16 inputs, fp32 output, gemm_bf16.h) of n×n×n: the
// peak MFU is measured against when train.precision = bf16.
PeakResult measure_bf16_matmul_peak(int n = 2048, int reps = 5);

// Runs the benchmark; returns the result object (DESIGN.md bench contract: tokens_per_s,
// gflops, mfu, peak_rss_mib, plus per-phase seconds). Prints a human table to stdout.
nlohmann::json run_bench(const Config& cfg, const BenchOptions& opts);

// Peak resident set size of this process so far, MiB.
double peak_rss_mib();

}  // namespace atl
