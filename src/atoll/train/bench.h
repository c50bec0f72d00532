// `atoll bench`: throughput of full training steps (forward, backward, clip, optimizer) on
// synthetic tokens, the time of each phase, and MFU against this machine's measured
// matrix-multiply peak. The FLOP count is the peer's formula (model.h flops_per_token).
#pragma once

#include <nlohmann/json.hpp>

#include "atoll/config/config.h"
#include "atoll/engine/engine.h"

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

// The peak that MFU is measured against, for `atoll bench` and the metrics rows (train.peak_gflops):
// `given` when > 0 (`given_by` says where it came from), else the engine's measured
// matrix-multiply peak in `precision`'s input type when `measure`, else none (gflops 0).
PeakRate mfu_peak(double given, const std::string& given_by, bool measure, const Engine& engine, Precision precision);

// Model FLOPs utilisation: flops_per_token(m) (model.h, the one FLOP count) times tokens_per_s,
// over `devices` devices of peak_gflops each; 0 without a peak.
double mfu_of(const ModelConfig& m, double tokens_per_s, int devices, double peak_gflops);

// Peak resident set size of this process so far, MiB.
double peak_rss_mib();

}  // namespace atl
