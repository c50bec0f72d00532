// The delayed outer step, diloco.outer_delay = 1 (issue 41; docs/islands.md "A delayed outer
// step"): the exchange of round r's pseudo-gradient runs behind the whole of round r+1, and the
// "eager" variant of Kale, Douillard and Donchev 2025 ("Eager updates for overlapped
// communication and computation in DiLoCo", https://arxiv.org/abs/2502.12996) keeps the
// islands from training round r+1 on a stale θ: each island starts it from the outer step its
// own Δ would make, and takes the mean's step when the mean arrives. With μ the outer momentum
// and lr the outer learning rate (the fma calls of dist/diloco.h, one IEEE rounding each):
//
//   end of round r (island i):
//     θ, m  ← the outer step of Δ̄_{r−1}, the mean that arrived     shared: bit-identical everywhere
//     Δ_i   = s_i − θ_local_i                                      s_i: where island i began round r
//     exchange Δ_i in the background (mean Δ̄_r at the end of round r+1)
//     s_i   ← θ − lr·(Δ_i + μ·(μ·m + Δ_i))                         the eager start: m is not changed
//     θ_local_i ← s_i
//
// So the global state (θ, m: what theta_hash and momentum_hash cover) is exactly plain DiLoCo's
// outer Nesterov sequence over the means, each applied one round late; only the start point s_i
// is the island's own. The mean's step corrects the eager one: round r+2 begins from
// θ_{r+1} − eager(Δ_{r+1}), where θ_{r+1} = θ_r − step(Δ̄_r) replaced θ_r − eager(Δ_r), so
// s_i moves by step(Δ̄_r) − eager(Δ_i,r) in effect, with every island's momentum the shared m.
// With lr = 1 and μ = 0 an island keeps all of its own progress and takes the others' one round
// late: s_i = θ_r − Δ_i.
//
// Where the paper mixes the island's fresh Δ/M with the others' stale Δs and gives every island
// a momentum of its own, here the stand-in for the mean is the island's whole Δ and the momentum
// stays the shared one, so nothing per island lives on past the round but s_i.
//
// While nothing is in flight (before the first outer step, after a blocking one) a round begins
// from θ, so the start point is θ: round_start() says which.
//
// Fragments (streaming DiLoCo, fragments.h): each fragment f is its own delayed outer step on its
// ranges, due at its own staggered steps: its own pending Δ_f, its own eager start s_f (fragment
// f's ranges of one buffer in θ's layout) and its own exchange in flight. So P exchanges are in
// flight at once, one per fragment, each behind the next H inner steps (streaming_delay.cc).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "atoll/dist/delay_inputs.h"
#include "atoll/dist/fragments.h"

namespace atl {

class OuterDelay {
 public:
  explicit OuterDelay(size_t n) : OuterDelay(whole_plan(n)) {}  // one fragment
  explicit OuterDelay(FragmentPlan plan)
      : plan_(std::move(plan)), start_(plan_.total, 0.0f), delta_(plan_.count() > 1 ? plan_.total : 0, 0.0f),
        pending_(size_t(plan_.count()), false) {}

  // A Δ_f awaits its mean: its exchange is in flight (or, on resume, to be started again).
  bool pending(int f) const { return pending_[size_t(f)]; }
  bool pending() const;  // any fragment's
  void set_pending(int f, bool p) { pending_[size_t(f)] = p; }
  void set_pending(bool p) { pending_.assign(pending_.size(), p); }  // every fragment's
  // Per fragment, for checkpoints (state_registry.cc: diloco_delay_pending).
  const std::vector<bool>& pending_list() const { return pending_; }
  void set_pending_list(const std::vector<bool>& p);
  // The eager starts s_f of the rounds in progress, in θ's layout (fragment f's ranges meaningful
  // while pending(f)).
  std::vector<float>& start() { return start_; }
  // Where fragment f's round began (θ's layout, read over f's ranges): s_f while Δ_f is pending, else θ.
  const float* round_start(int f, const std::vector<float>& theta) const {
    return pending(f) ? start_.data() : theta.data();
  }
  // Every fragment's round start, out[n] (a rollback to where the rounds began).
  void round_start(const std::vector<float>& theta, float* out) const;
  const FragmentPlan& plan() const { return plan_; }
  // Every fragment's pending Δ_f in θ's layout, as a checkpoint saves it: with one fragment
  // DilocoSync::delta(0) itself; else a copy of f's ranges kept as each snapshot takes Δ_f
  // (keep_delta), given back to the fragments before a resume redoes their exchanges.
  float* layout_delta(DilocoSync& sync) { return plan_.count() == 1 ? sync.delta(0).data() : delta_.data(); }
  void keep_delta(DilocoSync& sync, int f);
  void restore_deltas(DilocoSync& sync) const;
  // The residuals each exchange in flight began from, for checkpoints (delay_inputs.h).
  DelayInputs& inputs() { return inputs_; }

 private:
  FragmentPlan plan_;
  std::vector<float> start_;
  std::vector<float> delta_;   // more than one fragment: layout_delta()
  std::vector<bool> pending_;  // main thread only
  DelayInputs inputs_;
};

// The eager start: start[n] = θ − lr·(Δ + μ·(μ·m + Δ)), the outer Nesterov step Δ would make as
// the mean, written as outer_nesterov_step writes it; θ and m are only read.
void eager_start(float* start, const float* theta, const float* momentum, const float* delta, size_t n, double lr,
                 double momentum_coef);

}  // namespace atl
