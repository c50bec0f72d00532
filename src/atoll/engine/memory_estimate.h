// Whether a model and batch fit in memory, answered before anything is allocated or any data is
// prepared: a config too large for the machine is refused at once with the keys that drive the
// size, the estimate and what the machine has, instead of std::bad_alloc (or the kernel's OOM
// killer) after the data preparation.
//
// The estimate adds up what the engine allocates (engine.h): the flat parameters, gradients and
// optimizer moments (4 floats per parameter; under optim.zero1 with M > 1 workers per island, the
// two moments of this rank's shard only, the largest of zero_shards; on the GPU the host keeps
// copies of the same), the
// activations the model keeps for backward for one micro-batch (train.micro_batch_size, else
// train.batch_size, sequences of model.seq_len tokens: the residual stream, each block's
// attention q/k/v/output and expert hidden rows, router probabilities, norms' statistics) and
// the largest scratch (the head's logits chunk, the parts' shared work buffer, Muon's
// Newton-Schulz buffers). It mirrors the buffers of model/*.cc and is checked against the
// resident memory of a real engine by tests/engine/memory_estimate_test.cc.
//
// Under train.context_parallel = P a rank's model holds its T_r ≈ T/P tokens of each sequence
// (the largest rank's share counts), and ring attention's blocks in flight are scratch; the
// worker that validates (train.eval_every > 0) builds whole-sequence buffers for the pass
// after freeing its rank's, so its peak is the larger of the two (validator_host).
#pragma once

#include <cstddef>
#include <string>

#include "atoll/config/config.h"

namespace atl {

// Bytes, as doubles: an absurd config's sizes overflow 64-bit integers.
struct MemoryEstimate {
  double params = 0;       // parameters in the model (count, not bytes)
  double state = 0;        // parameters, gradients and optimizer moments
  double activations = 0;  // kept for backward at the micro-batch
  double scratch = 0;      // the largest scratch buffers
  double host = 0;         // all of it that lives in host memory
  double device = 0;       // all of it that lives on the GPU (train.device = cuda), else 0
  double validator_host = 0;  // host of the one worker that validates: more than host only when it
                              // builds whole sequences where the others hold their context share
};
MemoryEstimate estimate_memory(const Config& cfg, int workers_per_island = 1);

// Bytes a new allocation can get in host memory: MemAvailable from /proc/meminfo, lowered to
// the cgroup's memory.max minus memory.current where a limit is set (containers); 0 = unknown.
struct AvailableMemory {
  double bytes = 0;
  std::string source;  // where the figure comes from, for messages
};
AvailableMemory available_host_memory();

struct MemoryCheckOptions {
  int processes = 1;      // processes of this size on this machine (atoll launch: islands x workers)
  int workers_per_island = 1;  // M: optim.zero1 shards the optimizer moments among them
  int device_index = -1;  // the GPU (train.device = cuda), as EngineOptions::device_index
};

// ConfigError when the estimate (`processes` - 1 workers' host and one validator_host) exceeds the memory available, naming the
// keys that drive it, the estimate, what is available and the fix (train.memory_check = false
// skips the check, for when the estimate is wrong). Nothing is allocated. With data.phases, the
// phase that needs the most counts (its model.seq_len and train.batch_size).
void check_memory_fits(const Config& cfg, const MemoryCheckOptions& opts = {});

// "1.5 GiB", "312 MiB": sizes in messages.
std::string bytes_text(double bytes);

}  // namespace atl
