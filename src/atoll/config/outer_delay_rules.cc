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
  // The residual moves on while the exchange runs behind the next round, and a checkpoint is
  // taken with that exchange in flight: it would have to save the residual from before it.
  if (d.error_feedback)
    return head + "does not work with diloco.error_feedback yet: a checkpoint is taken while an exchange is in "
           "flight, and the residual before that exchange is not saved; fix: diloco.error_feedback = false, or "
           "diloco.outer_delay = 0";
  // The expert counts the exchange in flight carries would need saving with it likewise.
  if (d.expert_merge != "mean")
    return head + "does not work with diloco.expert_merge = \"" + d.expert_merge +
           "\" yet: a checkpoint is taken while an exchange is in flight, and the expert counts it carries are not "
           "saved; fix: diloco.expert_merge = \"mean\", or diloco.outer_delay = 0";
  // The sparse exchange's residual moves on likewise while the exchange is in flight.
  if (d.expert_topk > 0 && d.expert_topk < 1)
    return head + "does not work with diloco.expert_topk yet: a checkpoint is taken while an exchange is in "
           "flight, and the experts' residual before that exchange is not saved; fix: diloco.expert_topk = 0, or "
           "diloco.outer_delay = 0";
  return "";
}

}  // namespace atl
