#include "atoll/config/outer_delay_rules.h"

namespace atl {

std::string outer_delay_problem(const DilocoConfig& d) {
  if (d.outer_delay == 0) return "";
  const std::string head = "diloco.outer_delay = 1 (each round's exchange behind the whole next round) ";
  // Streaming's fragments and overlap hide part of a round's exchange; the delay hides all of it
  // behind the next round, so one exchange is always in flight: a fragment's would collide with it.
  if (d.fragments != 1 || d.overlap_steps != 0)
    return head + "works with diloco.fragments = 1 and diloco.overlap_steps = 0 (here " +
           std::to_string(d.fragments) + " and " + std::to_string(d.overlap_steps) +
           "): it already overlaps the whole exchange; fix: set diloco.fragments = 1 and diloco.overlap_steps = 0, "
           "or diloco.outer_delay = 0";
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
