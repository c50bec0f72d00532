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

}  // namespace atl
