#include "atoll/config/context_parallel.h"

#include <utility>
#include <vector>

#include "atoll/core/errors.h"
#include "atoll/model/part_kinds.h"
#include "atoll/model/ring_attention.h"

namespace atl {

std::string context_parallel_problem(const Config& cfg) {
  const int P = cfg.train.context_parallel, T = cfg.model.seq_len;
  if (P == 1) return "";
  const std::string key = "train.context_parallel = " + std::to_string(P);
  if (cfg.train.precision != "fp32")
    return key + " runs fp32 products (ring attention has no bf16 path yet); fix: train.precision = \"fp32\", "
           "or train.context_parallel = 1";
  // Each rank holds chunks r and 2P-1-r of 2P; the shortest chunk has ⌊T/2P⌋ tokens, at every
  // length a phase of data.phases trains at (the shortest phase is the first: phases never shrink).
  // A chunk at least as long as the boundary its successor reads (CCA's convolution window and
  // value shift) makes that boundary the one chunk before's own last rows, which its holder
  // sends (model/chunk_boundary.h); shorter chunks would need rows of several, so are refused.
  const int boundary = boundary_tokens(cfg.model);
  if (boundary > 0 && context_layout(T, P).contiguous)
    return key + " under ATOLL_CP_LAYOUT=plain: the plain split is for benchmarks of GQA only (CCA's boundary "
           "exchange is between the zigzag layout's neighbours); fix: unset ATOLL_CP_LAYOUT";
  std::vector<std::pair<int, std::string>> lengths = {{T, "model.seq_len"}};
  const std::vector<DataPhase> phases = data_phases(cfg.data);
  for (size_t p = 0; p < phases.size(); ++p)
    if (phases[p].seq_len > 0)
      lengths.push_back({phases[p].seq_len, "data.phases[" + std::to_string(p) + "].model.seq_len"});
  for (const auto& [len, name] : lengths)
    if (len / (2 * P) < boundary)
      return key + " cuts " + name + " = " + std::to_string(len) + " into chunks of " + std::to_string(len / (2 * P)) +
             " tokens, fewer than the " + std::to_string(boundary) +
             " tokens of the previous chunk the model reads (CCA's convolution window); fix: raise " + name +
             " to at least " + std::to_string(2 * P * boundary) + " or lower train.context_parallel";
  return "";
}

void check_context_parallel(const Config& cfg, int workers_per_island) {
  const int P = cfg.train.context_parallel;
  if (workers_per_island % P == 0) return;
  if (workers_per_island == 1)
    throw ConfigError("train.context_parallel = " + std::to_string(P) + " splits each sequence over " +
                      std::to_string(P) + " workers of an island, and `atoll train` runs one; fix: `atoll launch "
                      "--islands 1 --workers-per-island " + std::to_string(P) + "`, or train.context_parallel = 1");
  throw ConfigError("train.context_parallel = " + std::to_string(P) + " must divide --workers-per-island (" +
                    std::to_string(workers_per_island) + "): an island is D data-parallel groups of P ranks; fix: "
                    "--workers-per-island " + std::to_string(P * ((workers_per_island + P - 1) / P)) +
                    ", or a train.context_parallel that divides " + std::to_string(workers_per_island));
}

}  // namespace atl
