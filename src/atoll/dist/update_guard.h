// Bad updates from a peer (docs/islands.md "Trust at the door"): before the ring all-reduce of
// an outer step, every member of the outer group checks the pseudo-gradients Δ of the round, so
// one broken or hostile island cannot poison θ:
//
//   1. each member computes the norm of its Δ (NaN if any element is not finite) and all-gathers
//      it with its tag: the outer step and the hash of θ its Δ was computed from;
//   2. a Δ that is not finite, or whose tag is not the round's (the tag most members hold; a tie
//      goes to the lowest member's), is dropped: it contributes zeros with weight 0, and every
//      other member scales its Δ by P/K (K members contribute), so the ring's mean over P is the
//      mean over the K;
//   3. with 3 or more kept, a Δ pointing against the others is dropped: each member also sends a
//      CountSketch of its Δ (128 signed buckets, hashed the same way everywhere), and a Δ whose
//      sketch's cosine with the coordinate-wise median sketch is below min_cosine is dropped
//      (a sign-flipped Δ: honest DiLoCo pseudo-gradients of one θ point the same way);
//   4. a kept Δ whose norm exceeds clip_factor times the median norm of the kept ones (the lower
//      median, so that with two members the smaller norm bounds the larger) is scaled down to
//      that bound (clip_factor = 0: no clipping);
//   5. with weight_by_tokens (islands that sync on a time budget, diloco.sync_seconds), each kept
//      Δ is weighted by the tokens nᵢ its island trained in the round: scaled by K·nᵢ/Σn (Σ over
//      the kept), so the ring's mean is Σ nᵢΔᵢ / Σ nᵢ. The decisions above read the unweighted Δ.
//      Equal counts give a weight of exactly 1 (K·n / (K·n) in doubles), so today's mean.
//   6. with expert counts (diloco.expert_merge = "tokens", expert_merge.h), the elements of each
//      expert are weighted by the tokens each kept member's island routed to that expert in the
//      round instead: scaled by P·clip·cᵢₑ/Σc (0 for an expert no kept member used, which the
//      result lists). The counts travel in the same all-gather. The decisions above read the
//      unweighted Δ, so the guard applies before any weighting.
// Every member sees the same gathered figures, so every member reaches the same verdict, and the
// ring result stays bit-identical everywhere. The tag catches a stale Δ: one computed from an
// older θ (a confused or replaying island); it cannot catch a member that lies about its tag,
// whose Δ the clip still bounds.
//
// Each member also sends its round's work (RoundWork: its step and tokens), so every member
// learns the round's furthest step and its tokens in all (the time budget's step agreement).
//
// Costs one all-gather of ~2.5 KB per member, and a pass over Δ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "atoll/dist/expert_merge.h"
#include "atoll/dist/group.h"

namespace atl {

struct UpdateTag {
  int64_t outer_step = 0;  // the outer step the Δ is for
  std::string theta_hash;  // of the θ it was computed from
};

// What a member trained in the round its Δ is of (the time budget: diloco.sync_seconds).
struct RoundWork {
  int64_t step = 0;    // the member's step count at the end of its round
  int64_t tokens = 0;  // tokens it trained in the round
};

struct UpdateIncident {
  std::string kind;  // "dropped_update" | "clipped_update"
  int member = 0;    // the group rank whose Δ it was
  int island = -1;   // that member's island, where the caller knows it (streaming.h fills it in)
  std::string why;   // dropped: "not finite" | "stale: ..."; clipped: ""
  double norm = 0, median = 0, scale = 1;  // clipped: norm, the kept ones' median, the factor applied
};

struct GuardOptions {
  double clip_factor = 2.0;  // a kept Δ is clipped to clip_factor x the median norm; 0 = no clipping
  // With 3 or more kept, a Δ whose direction's cosine with the round's median direction is below
  // this is dropped; -1 = never (independent random Δs, as in tests of the ring, have cosine ~0).
  double min_cosine = -1.0;
  bool weight_by_tokens = false;  // weight each kept Δ by its RoundWork::tokens (step 5 above)
};

// This member's expert counts for the round and where its x holds each slot (step 6 above).
struct ExpertWork {
  std::vector<double> counts;      // per slot (layer·E + e): tokens routed to it in the round
  std::vector<ExpertSpan> spans;   // x's elements of each slot, relative to x, ascending
};

struct GuardResult {
  int contributors = 0;  // K
  std::vector<UpdateIncident> incidents;  // every member's drop or clip, in member order
  int64_t furthest_step = 0;  // the largest RoundWork::step of the round's members
  int64_t tokens = 0;         // Σ RoundWork::tokens over every member, dropped ones included (they trained)
  double weight = 1.0;        // this member's token weight K·nᵢ/Σn (0 when dropped; 1 without weighting)
  std::vector<int> unused_slots;  // with expert counts: the slots no kept member routed a token to
};

// In place on this member's x[n] (zeros when dropped, scaled when clipped or when others were
// dropped; per expert slot with `experts`, which every member passes or none). Every member of
// `group` calls it with its own Δ and tag; throws Timeout/PeerLost (the group's) with x unchanged.
GuardResult guard_update(ProcessGroup& group, float* x, size_t n, const UpdateTag& tag, const GuardOptions& opts,
                         const RoundWork& work = {}, const ExpertWork* experts = nullptr);

}  // namespace atl
