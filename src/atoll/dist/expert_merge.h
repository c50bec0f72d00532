// An outer mean that knows it trains experts (diloco.expert_merge = "tokens", docs/islands.md
// "Experts in the outer step"). In a mixture of experts each island routes its own tokens, so
// over a round an expert may see many of one island's tokens and none of another's. The second
// island's pseudo-gradient for that expert is then noise (weight decay, optimizer momentum), yet
// the flat mean gives it full weight. Here each expert's pseudo-gradient is weighted by the
// tokens its island routed to it in the round:
//
//   Δ̄_e = Σᵢ cᵢₑ·sᵢ·Δᵢₑ / Σᵢ cᵢₑ      over the islands i the update guard kept
//
// (cᵢₑ: island i's slots of expert e this round, every rank's micro-batches summed; sᵢ: the
// guard's clip factor, 1 unless clipped). Dense parameters keep the guard's mean. An expert no
// kept island routed a token to has no mean: θ and the outer momentum of its elements are left as
// they are (the outer step skips them), and every island's θ_local of it goes back to θ.
//
// A slot is one expert of one layer, numbered layer·E + e in the model's layer order. The
// counts travel in the update guard's all-gather (update_guard.h), so every island derives the
// same factors from the same figures and the ring's result stays bit-identical everywhere.
//
// This file holds the pure parts: where a fragment's experts lie in its flattened Δ, and the
// factor each member scales each slot by before the ring (whose mean divides by P).
#pragma once

#include <cstddef>
#include <vector>

#include "atoll/dist/fragments.h"

namespace atl {

// Elements [begin, end) (of θ, or of a flattened fragment) belong to expert slot `slot`.
struct ExpertSpan {
  size_t begin = 0, end = 0;
  int slot = 0;
};

// The expert spans of θ (ascending, disjoint) that lie in fragment f, in the fragment's
// flattened order (the order DilocoSync::snapshot packs Δ_f in), clipped to [lo, hi) and shifted
// so that lo is 0: what a rank exchanging the shard [lo, hi) of Δ_f scales.
std::vector<ExpertSpan> fragment_expert_spans(const std::vector<ExpertSpan>& theta_spans, const FragmentPlan& plan,
                                              int f, size_t lo, size_t hi);

// Per slot, the factor member `me` scales its Δ's elements of that slot by before the ring:
// P·clip·c_me / Σ_kept c (the ring divides by P), 0 where no kept member routed a token to the
// slot or `me` was not kept. counts[m][slot] per member m. Exact integers in doubles: equal
// counts give exactly P/K, which is 1 when no member was dropped.
std::vector<double> expert_factors(const std::vector<std::vector<double>>& counts, const std::vector<bool>& kept,
                                   int me, double clip);

// Slots no kept member routed a token to (ascending).
std::vector<int> unused_slots(const std::vector<std::vector<double>>& counts, const std::vector<bool>& kept);

}  // namespace atl
