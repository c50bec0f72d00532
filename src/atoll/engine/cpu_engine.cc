#include "atoll/engine/cpu_engine.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "atoll/backend/cpu/gemm.h"
#include "atoll/backend/cpu/gemm_bf16.h"
#include "atoll/core/check.h"
#include "atoll/core/rng.h"
#include "atoll/core/timer.h"
#include "atoll/optim/bias_balance.h"
#include "atoll/optim/clip.h"

namespace atl {

CpuEngine::CpuEngine(const Config& cfg, const EngineOptions& opts) : Engine(cfg, micro_batch(cfg.train), opts) {}

LossParts CpuEngine::forward_backward(const int32_t* inputs, const int32_t* targets, int B, double loss_scale) {
  return host_model_.forward_backward(inputs, targets, B, loss_scale);
}

LossParts CpuEngine::forward(const int32_t* inputs, const int32_t* targets, int B, float* position_losses) {
  return host_model_.forward(inputs, targets, B, position_losses);
}

double CpuEngine::clip_grads(double max_norm) {
  // The slots of balanced rows hold router loads, not gradients (optim/bias_balance.h).
  if (!zero1())
    return clip_grad_norm(host_model_.grads().data(), host_model_.grads().size(), max_norm,
                          balanced_spans(host_model_.layout()));
  // ZeRO-1: the island's gradients are only in this rank's shard; the squares of every shard
  // summed over the island give the norm (the others' elements are never read again).
  ATOLL_CHECK(zero_link_.sum) << "a ZeRO-1 engine steps only after join_zero";
  const ZeroShard s = host_opt_.shard();
  std::vector<std::pair<size_t, size_t>> left_out;
  for (const auto& [offset, count] : balanced_spans(host_model_.layout()))
    if (s.contains(offset)) left_out.emplace_back(offset - s.lo, count);
  float* g = host_model_.grads().data() + s.lo;
  const double norm = std::sqrt(zero_link_.sum(grad_sumsq(g, s.size(), left_out)));
  clip_to_norm(g, s.size(), max_norm, norm);
  return norm;
}

void CpuEngine::optimizer_step(double lr) {
  host_opt_.step(host_model_.params().data(), host_model_.grads().data(), lr);
  if (zero1()) zero_link_.allgatherv(host_model_.params().data(), zero_sizes_);  // every shard's new values
}

PeakRate CpuEngine::matmul_peak(Precision precision) const {
  return precision == Precision::kBf16 ? measure_bf16_matmul_peak() : measure_matmul_peak();
}

void CpuEngine::reset_phase_times() { host_model_.phase_times() = {}; }

std::vector<std::pair<std::string, double>> CpuEngine::phase_times() {
  const PhaseTimes& ph = host_model_.phase_times();
  return {{"attention", ph.attention}, {"router_dispatch", ph.router_dispatch}, {"experts", ph.experts},
          {"head_loss", ph.head_loss}, {"embedding", ph.embed},                 {"weights_bf16", ph.weights_bf16}};
}

PeakRate measure_matmul_peak(int n, int reps) {
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  Rng rng(1);
  for (auto& x : a) x = float(rng.uniform() - 0.5);
  for (auto& x : b) x = float(rng.uniform() - 0.5);
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {  // the first run warms caches and threads up
    const double t0 = now_s();
    gemm<float>(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (r > 0) best = std::min(best, now_s() - t0);
  }
  return {.gflops = 2.0 * n * n * n / best * 1e-9,
          .method = "best of " + std::to_string(reps) + " fp32 oneDNN sgemm " + std::to_string(n) + "x" +
                    std::to_string(n) + "x" + std::to_string(n)};
}

PeakRate measure_bf16_matmul_peak(int n, int reps) {
  std::vector<bf16> a(size_t(n) * n), b(size_t(n) * n);
  std::vector<float> c(size_t(n) * n);
  Rng rng(1);
  for (auto& x : a) x = float_to_bf16(float(rng.uniform() - 0.5));
  for (auto& x : b) x = float_to_bf16(float(rng.uniform() - 0.5));
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {  // the first run also builds the primitive
    const double t0 = now_s();
    gemm_bf16(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (r > 0) best = std::min(best, now_s() - t0);
  }
  return {.gflops = 2.0 * n * n * n / best * 1e-9,
          .method = "best of " + std::to_string(reps) + " bf16 oneDNN matmul " + std::to_string(n) + "x" +
                    std::to_string(n) + "x" + std::to_string(n)};
}

}  // namespace atl
