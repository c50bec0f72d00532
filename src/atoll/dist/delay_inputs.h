// The delayed outer step's exchange in flight (diloco.outer_delay = 1, outer_delay.h) reads, besides
// the island's Δ, state that it also replaces as it runs: error feedback's residual (the ring adds
// it to the island's input and keeps what the codec's bytes left out, diloco.error_feedback) and
// the sparse expert exchange's (the experts not sent, diloco.expert_topk, expert_topk.h). A
// checkpoint is taken right after that exchange started, and a resumed run redoes it from the
// saved state, so the checkpoint must hold these residuals as they were before it; the live ones
// belong to the background thread until the exchange is applied. take() copies them on the main
// thread just before the exchange starts, and the checkpoint saves the copy while that exchange is
// in flight (state_registry.cc: diloco_residual, diloco_expert_residual).
//
// Why a copy, rather than encoding on the main thread and saving what is sent: the ring quantizes
// each element at the hop where it leaves this rank, a partial sum that includes the other islands'
// inputs (ring_allreduce.h), so there is no encoded input before the exchange runs; and a redone
// exchange from the copy runs the very code of the first one. The copy costs n floats per residual
// once per round of H inner steps.
//
// Not copied, because the exchange only reads them until it is applied: the island's expert counts
// the exchange carries (DilocoSync::snapshot_counts, saved as diloco_delay_expert_counts) and the
// Δ itself (diloco_delay_delta). The sparse exchange's selection is not saved either: it is a
// function of Δ, the residual and the update guard's verdict over every island's Δ, all restored,
// so the redone exchange chooses the same experts.
//
// Fragments: each fragment's exchange has its own residuals (a ring and an expert residual per
// fragment), so take() copies the ranges of the fragment whose exchange starts, and read()
// composes: the fragments in flight from their copies, the others live (no thread writes those).
#pragma once

#include <vector>

#include "atoll/dist/diloco.h"

namespace atl {

class DelayInputs {
 public:
  // Fragment f's residuals of `sync` as its exchange about to start will find them (main thread,
  // f not in flight): each in θ's layout, this rank's shard (DilocoSync::residual, expert_residual).
  void take(const DilocoSync& sync, int f);
  void take(const DilocoSync& sync);  // every fragment's
  // A residual as a checkpoint saves it, the ring's (error feedback) or the experts' (expert_topk):
  // of each fragment f, the copy while in_flight[f] (the exchange it was taken for has not been
  // applied), else the live one.
  enum class Residual { kRing, kExperts };
  void read(const DilocoSync& sync, Residual which, const std::vector<bool>& in_flight, float* out) const;
  // The live residuals were restored: they are the state before the exchanges again, until take().
  void forget() { held_.clear(); }

 private:
  std::vector<float> residual_, expert_residual_;
  std::vector<bool> held_;  // per fragment: its ranges of the copies are taken
};

}  // namespace atl
