// Checkpoints of the training state as walks of the state registry (state_registry.h), in the
// one checkpoint format of every kind of run (ckpt/checkpoint.h): a single-process run saves as
// 1 island x 1 worker with the registry's entries for a run without DiLoCo; a multi-island run
// adds DiLoCo's.
//
// Every worker writes its own part, in parallel, and nothing is gathered to one worker: the plan
// (ckpt/checkpoint_plan.h) deals each island's copy of an entry kept per island out among the
// island's ranks, and each run-wide entry (θ, outer momentum) among every live worker. A save
// (Checkpointer::save, every worker at the same step) blocks the step only for the plan: which
// of the live buffers' tensors this worker writes, and its JSON values (the island's
// quantization residual, held in shards, is first summed over the island: the one collective).
// A background thread (ckpt/background_writer.h) copies those tensors into a staging buffer
// while the next step's forward and backward passes read them, then releases the training
// thread's fence (Checkpointer::fence: the step waits there before its first write to saved
// state), then writes and fsyncs the part and hands its
// index and values to the committer (rank 0 of the lowest live island) through the PartExchange
// (the store in a multi-process run: no collective races the training step's), and the
// committer's thread, once every part is in, writes the manifest and commits. A missing island
// of an elastic run (StatePlace::members) writes nothing: its copies in the manifest name the
// first live island's tensors, its workers' cursors come from absent_value (their membership
// records) or else the same rank of the first live island.
//
// Resume on another shape (check_resume, restore_training_state): a checkpoint of N islands x M
// workers continues as N' x M' in `atoll launch`. Kept: θ, the outer momentum and the counters;
// islands below min(N, N') keep their own parameters and moments. An island beyond N starts as
// a joiner does: its parameters from θ (island 0's when the checkpoint has no θ), its moments
// from island 0's copy, its quantization residual from zero. Islands beyond N' are dropped with
// their local progress since their last outer step. Data: worker w' continues saved worker
// w' mod (N·M)'s cursor; with another worker count it is mapped to the same share of the epoch
// (data/loader.h set_cursor: a few windows may repeat or be skipped).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/dist/group.h"
#include "atoll/dist/store.h"
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

// How the parts of a save reach the committer: put by every writer's background thread,
// collected by the committer's. A multi-process run uses the store (StorePartExchange); a
// single-process run has one writer and needs none.
class PartExchange {
 public:
  virtual ~PartExchange() = default;
  virtual void put(int64_t step, int writer, const nlohmann::json& part) = 0;
  // Every writer's part, in the order given; nullopt when some did not arrive within the bound.
  virtual std::optional<std::vector<nlohmann::json>> collect(int64_t step, const std::vector<int>& writers) = 0;
};

// Parts under "atoll/<run_id>/ckpt/<step>/<writer>" in the run's Redis store, over a connection
// of its own (the background threads use it while the training thread uses the store too).
class StorePartExchange final : public PartExchange {
 public:
  // The store as the worker's own connection has it (its password; its records' sealer, which
  // authenticates the parts: dist/store.h).
  explicit StorePartExchange(const StoreOptions& store);
  ~StorePartExchange() override;
  void put(int64_t step, int writer, const nlohmann::json& part) override;
  std::optional<std::vector<nlohmann::json>> collect(int64_t step, const std::vector<int>& writers) override;

 private:
  std::string key(int64_t step, int writer) const;
  std::unique_ptr<Store> store_;
};

struct CheckpointerOptions {
  PartExchange* exchange = nullptr;  // null: a single-process run (this worker writes all)
  uint64_t token = 0;                // names the temporary directory; equal on every worker
  // On the committer's background thread, after `latest` names the new checkpoint.
  std::function<void(const std::string& dir, int64_t step)> on_commit{};
  std::string who{};  // "island I rank R", for log lines
};

// What a save cost the step that started it (metrics.h StepRow ckpt_*).
struct SaveReport {
  double stall_s = 0;                // the step blocked: waiting for the previous save and the plan
  double wait_s = 0;                 // of which waiting for the previous save
  std::optional<double> write_s{};  // background time of the newest completed save
};

class Checkpointer {
 public:
  Checkpointer(const Config& cfg, std::string run_dir, TrainingState& s, CheckpointerOptions opts = {});
  ~Checkpointer();
  // The checkpoint of s.loop.step (every worker of the run calls it at the same step): waits
  // for the previous save, plans, and leaves the copy and the write to the background. Throws
  // what the previous save failed with, and PeerLost/Timeout from the island's residual sum.
  // Until fence() returns, the caller must not write any saved tensor (it may read them).
  SaveReport save(const StatePlace& place);
  // Waits until the save in flight has copied the saved tensors. The training step calls it
  // before its first write to them (train/step.h; rollback, optimizer and outer steps come
  // after it), and TrainingState::fence (installed here) before any other write (a resume, a
  // state transfer, an admission). Returns the seconds waited for the first call after a save,
  // else nullopt. Two test hooks, read at construction: ATOLL_CHECK_SNAPSHOT=1 (always on in
  // debug builds) checksums each saved tensor at save() and fails the save (a bug: a write
  // before the fence) when its copy differs; ATOLL_TEST_SKIP_CKPT_FENCE=1 makes this fence
  // return at once, so a test shows what it prevents.
  std::optional<double> fence();
  // Waits for the save in flight; returns the newest checkpoint this process committed ("" if
  // none). Throws what the save failed with.
  std::string finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One save, waited for: a single-process run's (place {}) or a test's.
std::string save_training_state(const Config& cfg, const std::string& run_dir, TrainingState& s,
                                const StatePlace& place);

// The `reshape` event of a resume on another shape (see above: what is kept and dropped), or
// null when the checkpoint's shape is this run's.
nlohmann::json describe_reshape(const nlohmann::json& manifest, int islands, int workers_per_island);

// The manifest of checkpoint `dir` in the current format: a version-1 manifest is upgraded (the
// shape and "loaders" from its state, "entries" from the registry's names found in it).
nlohmann::json read_training_manifest(const std::string& dir);

// Throws ConfigError (naming the checkpoint, the field and the fix) unless checkpoint `dir`
// (manifest as read_training_manifest returns it) can resume a run of this config and shape:
// every required entry present, each entry's own check passed, and for `atoll train` (`diloco`
// false, as for state_registry) a checkpoint of 1 island x 1 worker. A DiLoCo run resumes any
// shape (see above).
void check_resume(const nlohmann::json& manifest, const std::string& dir, const Config& cfg, int islands,
                  int workers_per_island, bool diloco);

// This worker's state from checkpoint `dir` (checked by check_resume first): its island's copy
// of each tensor entry, its own value of each JSON entry (on another shape: see above). Validates every tensor before it
// changes anything (ckpt/checkpoint.h load_checkpoint).
void restore_training_state(const std::string& dir, const nlohmann::json& manifest, const Config& cfg, TrainingState& s,
                            const StatePlace& place);

}  // namespace atl
