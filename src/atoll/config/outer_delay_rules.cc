#include "atoll/config/outer_delay_rules.h"

#include "atoll/config/toml_text.h"
#include "atoll/core/errors.h"

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

void check_outer_delay_placement(const DilocoConfig& d, int workers_per_island) {
  // The sparse expert exchange sums each expert's norm over the island's workers inside the
  // exchange, on the island's group; with the delay that exchange runs behind the next round,
  // whose inner steps use the same group (the island's loss, ZeRO-1): two threads in one group's
  // collectives, which hang.
  const bool sparse = d.expert_topk > 0 && d.expert_topk < 1;
  if (d.outer_delay > 0 && sparse && workers_per_island > 1)
    throw ConfigError("diloco.outer_delay = 1 with diloco.expert_topk = " + fmt_double(d.expert_topk) +
                      " works with one worker per island (here --workers-per-island " +
                      std::to_string(workers_per_island) + "): the sparse exchange sums the experts' norms over the "
                      "island's workers while the next round's inner steps use the same island group; fix: "
                      "--workers-per-island 1, diloco.expert_topk = 0, or diloco.outer_delay = 0");
}

}  // namespace atl
