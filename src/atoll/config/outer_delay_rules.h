// diloco.outer_delay = 1 (docs/islands.md "A delayed outer step"): which runs can hide each
// round's exchange behind the whole next round, checked before anything runs. Each refusal
// names the keys, the reason and the fix; a combination not built yet is refused, never run
// silently wrong.
#pragma once

#include <string>

#include "atoll/config/config.h"

namespace atl {

// "" when the [diloco] section allows its outer_delay, else why not and the fix.
std::string outer_delay_problem(const DilocoConfig& d);

// The placement (`--workers-per-island`, launch and every worker before anything starts):
// ConfigError when the delay cannot run with this many workers per island.
void check_outer_delay_placement(const DilocoConfig& d, int workers_per_island);

}  // namespace atl
