#include "atoll/config/outer_delay_rules.h"

namespace atl {

std::string outer_delay_problem(const DilocoConfig& d) {
  if (d.outer_delay == 0) return "";
  const std::string head = "diloco.outer_delay = 1 (each round's exchange behind the whole next round) ";
  // An overlapped exchange hides τ inner steps of a round's exchange; the delay already hides all of
  // it behind the next round. Fragments compose: each is its own delayed step (dist/outer_delay.h).
  if (d.overlap_steps != 0)
    return head + "already hides the whole exchange behind the next round, so diloco.overlap_steps = " +
           std::to_string(d.overlap_steps) + " has nothing left to hide; fix: set diloco.overlap_steps = 0 "
           "(diloco.fragments works with the delay), or diloco.outer_delay = 0";
  // A time budget's commit makes every island adopt the step of the round just exchanged; with
  // the delay the commit is of the round before, while the islands have each trained another
  // round on their own clock, so there is no step they all hold.
  if (d.sync_seconds > 0)
    return head + "does not work with a time budget (diloco.sync_seconds > 0): a commit would adopt the step of "
           "the round before the one each island just trained on its own clock; fix: diloco.sync_seconds = 0, or "
           "diloco.outer_delay = 0";
  // Error feedback, the per-expert token weights and the sparse expert exchange compose: the
  // state their exchange in flight reads is saved with a checkpoint as it was before it
  // (dist/delay_inputs.h, train/state_registry.cc), and a resumed run redoes it bit for bit.
  return "";
}

}  // namespace atl
