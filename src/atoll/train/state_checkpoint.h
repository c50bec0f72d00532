// Checkpoints of the training state as walks of the state registry (state_registry.h), in the
// one checkpoint format of every kind of run (ckpt/checkpoint.h): a single-process run saves as
// 1 island x 1 worker with the registry's entries for a run without DiLoCo; a multi-island run
// adds DiLoCo's.
//
// Until the sharded writer exists, worker 0 (island 0, rank 0; in an elastic run missing island
// 0, rank 0 of the lowest island there is) writes every checkpoint: the save
// walk gathers each entry's copies to it by the entry's division (a run-wide entry is worker 0's
// own; the islands' rank 0s send their copy of an entry replicated in the island over the outer
// group; an island's ranks sum their disjoint shards over the island group first; cursors travel
// over both). The buffers are gathered to worker 0 only (an all-gather once gave every island's
// rank 0 a copy of all N islands' buffers, which ran a 4-island small-config run out of memory).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/dist/group.h"
#include "atoll/train/state_registry.h"

namespace atl {

// Where this worker sits and its groups (null in a single-process run).
struct StatePlace {
  int island = 0, rank = 0, islands = 1, workers_per_island = 1;
  ProcessGroup* inner = nullptr;  // the island's workers
  ProcessGroup* outer = nullptr;  // rank `rank` of every island (of `members`)
  // An elastic run missing islands: the islands in the outer group, by group rank (ascending;
  // empty: every island). The writer is rank 0 of the first. A missing island's entries divided
  // by island are the writer's copies (what the island would receive if it rejoined); its
  // per-worker values come from `absent_value(island, rank, entry)` when that gives one
  // (the worker's membership record), else from the writer.
  std::vector<int> members{};
  std::function<std::optional<nlohmann::json>(int island, int rank, const std::string& entry)> absent_value{};
};

// The checkpoint of s.loop.step: a collective walk of the registry (every worker calls it);
// worker 0 (rank 0 of the lowest member island) writes. Beside the registry's entries, the
// manifest's state holds "tokenizer_fingerprint": the tokenizer of the training data
// (data/prepare.h dataset_tokenizer_fingerprint), absent for data without one. Returns the
// directory on worker 0, "" elsewhere.
std::string save_training_state(const Config& cfg, const std::string& run_dir, TrainingState& s,
                                const StatePlace& place);

// The manifest of checkpoint `dir` in the current format: a version-1 manifest is upgraded (the
// shape and "loaders" from its state, "entries" from the registry's names found in it).
nlohmann::json read_training_manifest(const std::string& dir);

// Throws ConfigError (naming the checkpoint, the field and the fix) unless checkpoint `dir`
// (manifest as read_training_manifest returns it) can resume a run of this config and shape:
// the same islands x workers, every required entry present, each entry's own check passed.
// `diloco`: as for state_registry (false: `atoll train`).
void check_resume(const nlohmann::json& manifest, const std::string& dir, const Config& cfg, int islands,
                  int workers_per_island, bool diloco);

// This worker's state from checkpoint `dir` (checked by check_resume first): its island's copy
// of each tensor entry, its own value of each JSON entry. Validates every tensor before it
// changes anything (ckpt/checkpoint.h load_checkpoint).
void restore_training_state(const std::string& dir, const nlohmann::json& manifest, const Config& cfg, TrainingState& s,
                            const StatePlace& place);

}  // namespace atl
