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
  double peak_gflops = 0;  // > 0: MFU against this peak (e.g. the vendor's), not a measured one
};

// Runs the benchmark; returns the result object (DESIGN.md bench contract: tokens_per_s,
// gflops, mfu, peak_rss_mib, plus per-phase seconds). Prints a human table to stdout.
nlohmann::json run_bench(const Config& cfg, const BenchOptions& opts);

// Peak resident set size of this process so far, MiB.
double peak_rss_mib();

}  // namespace atl
