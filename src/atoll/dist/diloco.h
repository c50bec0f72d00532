// The DiLoCo outer loop across islands (DESIGN.md "DiLoCo"; Douillard et al. 2023,
// https://arxiv.org/abs/2311.08105). Every island keeps the global parameters θ and the outer
// momentum m, flat arrays laid out like the parameters. Every H inner steps, each island:
//
//   Δ  = θ − θ_local                         its pseudo-gradient
//   Δ̄  = mean over islands of Δ              RingAllreduce with the run's codec (bit-identical
//                                             on every island, optional error feedback)
//   m  = μ·m + Δ̄                              outer Nesterov momentum
//   θ  = θ − lr·(Δ̄ + μ·m)
//   θ_local ← θ
//
// Bit-identical θ on every island: Δ̄ is identical (the ring's promise), θ and m start identical,
// and the update is written with explicit std::fma calls, one IEEE rounding each, so neither the
// compiler's contraction choices nor the machine can make two islands round differently.
//
//   m_i = fma(μ, m_i, Δ̄_i);  u_i = fma(μ, m_i, Δ̄_i);  θ_i = fma(−lr, u_i, θ_i)
//
// With lr = 1 and μ = 0 this is θ − Δ̄ = mean of the islands' θ_local (to one rounding): plain
// parameter averaging, which for H = 1 and a linear inner optimizer (SGD) is data parallel.
//
// After each sync the hash of θ (xxh3 of its bytes, 16 hex digits) is returned; islands log it
// and compare. The outer step count is part of the state (checkpoints).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "atoll/dist/group.h"
#include "atoll/dist/ring_allreduce.h"

namespace atl {

struct DilocoOptions {
  int64_t inner_steps = 100;  // H
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  RingOptions ring{};
};

struct SyncResult {
  int64_t outer_step = 0;  // outer steps done, this one included
  std::string theta_hash;  // hex xxh3 of θ after the step
  uint64_t bytes_sent = 0; // by this call
  double seconds = 0;      // wall time of this call
};

class DilocoSync {
 public:
  // θ starts as theta0[n] (every island must pass the same values; the caller checks with
  // theta_hash() if it wants), the momentum at zero. `outer` is the group across islands.
  DilocoSync(ProcessGroup& outer, const float* theta0, size_t n, const DilocoOptions& opts);

  // True when an outer step follows inner step `step` (1-based): every H steps, and at
  // `last_step` so a run always ends on the global parameters.
  bool due(int64_t step, int64_t last_step) const;

  // One outer step (see above); theta_local[n] <- θ. On failure (Timeout, PeerLost) θ, the
  // momentum and theta_local are unchanged.
  SyncResult sync(float* theta_local);

  std::string theta_hash() const;
  std::vector<float>& theta() { return theta_; }
  std::vector<float>& momentum() { return momentum_; }
  int64_t outer_step() const { return outer_step_; }
  void set_outer_step(int64_t s) { outer_step_ = s; }
  const RingAllreduce& ring() const { return ring_; }

 private:
  DilocoOptions opts_;
  RingAllreduce ring_;
  std::vector<float> theta_, momentum_, delta_;
  int64_t outer_step_ = 0;
};

// The outer Nesterov update on n elements (the formulas above), for tests and for sync().
void outer_nesterov_step(float* theta, float* momentum, const float* mean_delta, size_t n, double lr,
                         double momentum_coef);

// Hex xxh3 (16 digits) of n floats' bytes.
std::string hash_floats(const float* x, size_t n);

}  // namespace atl
