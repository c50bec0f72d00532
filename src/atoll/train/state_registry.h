// The state registry (DESIGN.md "Core decisions"): every piece of training state, declared once
// in state_registry() (state_registry.cc), with what it is, who owns it and how it divides among
// the ranks of a run of N islands x M workers. Save, load, the resume check and the start-up
// agreement check are walks over that one list; none of them names a piece of state. Adding
// state (a router's balancing biases, a membership epoch, RNG state) is one new entry there.
//
// The entries today (name: type, owner, division):
//   param, adam_m, adam_v        tensor  engine  replicated_in_island  parameters, moments
//                                                (moments in shards with ZeRO-1: StateEntry::zero_shard)
//   step, tokens                 json    driver  run                   schedule scalars
//   optimizer_step               json    engine  run                   the optimizer's step count
//   loaders                      json    loader  per_worker            data cursors
//   diloco_theta                 tensor  diloco  run                   θ (DiLoCo runs)
//   diloco_momentum              tensor  diloco  run                   outer momentum
//   diloco_residual              tensor  diloco  sharded_in_island     error feedback (if on)
//   diloco_expert_counts         json    diloco  per_worker            tokens per expert (expert_merge)
//   diloco_expert_residual       tensor  diloco  sharded_in_island     experts not yet sent (expert_topk)
//   fragment_outer_steps         json    diloco  run                   outer steps per fragment
//   outer_step                   json    diloco  run                   their sum (saved for readers)
//   diloco_delay_pending         json    diloco  run                   a Δ awaits its mean, per fragment (outer_delay)
//   diloco_delay_delta           tensor  diloco  replicated_in_island  those Δs, the island's
//   diloco_delay_start           tensor  diloco  replicated_in_island  where the island's round began
//   diloco_delay_expert_counts   json    diloco  per_island            the counts that Δ's exchange carries
//                                                (expert_merge; the residuals above are saved as they
//                                                were before that exchange: dist/delay_inputs.h)
//
// Divisions: run (equal on every worker; saved once), replicated_in_island (every rank of an
// island holds the same; saved once per island, from its rank 0), per_island (one value per
// island), sharded_in_island (each rank holds its shard; saved once per island, the island's
// whole), per_worker (one value per worker; saved by global worker index). The checkpoint's
// naming of each division's copies is in ckpt/checkpoint.h.
//
// Checkpoints walk the registry: train/state_checkpoint.h.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/dist/diloco.h"
#include "atoll/dist/outer_delay.h"
#include "atoll/optim/zero_shard.h"
#include "atoll/train/loop.h"

namespace atl {

enum class StateType { kTensor, kJson };
enum class Division { kRun, kPerIsland, kReplicatedInIsland, kShardedInIsland, kPerWorker };
const char* division_name(Division d);  // "run", "per_island", ...

// The live state of one worker that the registry's accessors read and write.
struct TrainingState {
  Loop& loop;
  DilocoSync* diloco = nullptr;  // null: a run without DiLoCo (`atoll train`)
  OuterDelay* delay = nullptr;   // diloco.outer_delay = 1 (dist/outer_delay.h); null otherwise
  // Waits until the checkpoint save in flight has copied the saved tensors (its Checkpointer
  // installs it: state_checkpoint.h): called first by whatever writes them outside the step's
  // own fence (a resume, a state transfer, an admission).
  std::function<void()> fence = [] {};
};

// One piece of training state. Accessors are called only by walks that move values, with the
// TrainingState the registry was built over; the resume check walks without one.
struct StateEntry {
  std::string name;  // checkpoint kind (tensors) or key in the manifest's "state" (JSON)
  StateType type = StateType::kJson;
  std::string owner;  // engine, driver, loader, diloco
  Division division = Division::kRun;
  std::string what;  // for messages
  // Tensors: the buffer itself (data) or, where the value is assembled, read/write of this
  // rank's value in the layout (a shard: zeros outside it). layout().total() floats.
  std::function<float*()> data{};
  std::function<void(float*)> read{};
  std::function<void(const float*)> write{};
  // ZeRO-1 (optim/zero_shard.h): the island's value is held in shards, this rank's
  // [zero_shard().lo, hi) at zero_data(); read and write see zeros outside it. Each rank saves
  // its own shard's tensors; an island's ranks hold different values, so state_hash leaves it
  // out. Null elsewhere.
  std::function<ZeroShard()> zero_shard{};
  std::function<float*()> zero_data{};
  // JSON: this worker's value, and back (null: derived from other entries, saved for readers).
  std::function<nlohmann::json()> get{};
  std::function<void(const nlohmann::json&)> set{};
  // The saved value (of this worker, for a divided entry) against this run: "" when it can
  // resume, else the reason and the fix.
  std::function<std::string(const nlohmann::json&)> check{};
  // A checkpoint without this entry (one of another kind of run): what the run does instead,
  // in words ("" = the entry is required), and that action, run after every present entry is
  // restored (null: the live value stays as it is).
  std::string if_absent{};
  std::function<void()> on_absent{};
};

// The entries of a run with this config; `diloco`: a run with DiLoCo state (`atoll launch`
// workers). `live` may be null for walks that only read the declarations.
std::vector<StateEntry> state_registry(const Config& cfg, bool diloco, TrainingState* live);

// The entries' own record in a checkpoint manifest's "entries" (ckpt/checkpoint.h): type, owner,
// division and the number of copies saved in a run of this shape.
nlohmann::json describe_entry(const StateEntry& e, int islands, int workers_per_island);

// Bytes of one checkpoint of a run of N islands x M workers with this config (`atoll doctor`'s
// disk check): every tensor entry's copies (describe_entry's count) of the layout's floats, saved
// as F32 (ckpt/checkpoint.h); the JSON values and the manifest are small beside them, left out.
double checkpoint_bytes_estimate(const Config& cfg, int islands, int workers_per_island);

// Checkpoint kind of island i's copy of a tensor entry saved once per island: "param" for
// island 0 (what `atoll eval` reads), "island<i>_param" for the others.
std::string island_kind(int island, const std::string& name);

// Hex xxh3 of the entries of these divisions (tensors over the layout's entries, JSON as text),
// in registry order: what workers that must agree compare. ZeRO-1 shards are left out.
std::string state_hash(const std::vector<StateEntry>& entries, const ParamLayout& layout,
                       const std::vector<Division>& divisions);

}  // namespace atl
