// train.context_parallel = P (docs/long_context.md): which runs can split their sequences over
// P workers of an island, checked before anything runs. Each refusal names the key, the reason
// and the fix; a combination not built yet is refused, never run silently wrong.
#pragma once

#include <string>

#include "atoll/config/config.h"

namespace atl {

// "" when the config alone allows its context_parallel, else why not (ring attention runs fp32
// products on the CPU; every chunk of ⌊T/2P⌋ tokens must hold the model's boundary tokens, the
// rows of the chunk before that CCA's convolutions and value shift read).
std::string context_parallel_problem(const Config& cfg);

// The placement: P must divide the island's workers (workers_per_island; 1 for `atoll train`).
// ConfigError naming the key, the flag and the fix.
void check_context_parallel(const Config& cfg, int workers_per_island);

}  // namespace atl
