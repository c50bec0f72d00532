// The run directory (DESIGN.md "Files"): config.toml, metrics.jsonl, events.jsonl,
// checkpoints/, tokenizer.model, summary.txt, and .lock while a process writes it. Opening one
// either starts a fresh run in an empty or new folder, or continues the run it holds (--resume);
// it never mixes two runs in one folder, and one process writes it at a time (run_lock.h).
//
// The rules of --resume:
//   - the folder must hold an atoll run: config.toml and the traces a run leaves from its first
//     moments (checkpoints/, made before config.toml, or the run's first event in events.jsonl:
//     `start`, or `launch` for atoll launch); a folder that does not exist, holds other files or
//     a config.toml alone (a copy among the user's files) is an error that changes nothing;
//   - the run continues with its own config.toml; a change is checked key by key
//     (resume_config.h): the keys of kResumeSafeKeys may change, any other only with
//     allow_config_change, a [model] key never;
//   - it continues from the newest intact checkpoint: a damaged one (its manifest, a missing,
//     truncated or changed rank file: every tensor is checked against the manifest as the
//     checkpoint is read, once) is skipped with a warning and a `checkpoint_skipped` event, and
//     kept, moved aside as step-NNNNNNNN.damaged when the run starts (so no later save or prune
//     removes it); checkpoints/latest names the newest complete one again at the next commit.
//     A run without a checkpoint yet (stopped before its first) starts over from step 0, saying
//     so in the log and with a `start_over` event; checkpoints that are all damaged are an error
//     (starting over would replace them).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/train/metrics.h"
#include "atoll/train/resume_config.h"
#include "atoll/train/run_lock.h"

namespace atl {

struct RunDirOptions {
  bool resume = false;               // continue the run the folder holds
  bool allow_config_change = false;  // --resume may change keys outside kResumeSafeKeys
  // Resuming: open_run_dir settles the checkpoint on the newest intact one (verify_checkpoint,
  // every tensor read once). false: the caller does, as it loads it (resume_from_intact).
  bool verify_checkpoint = true;
};

// A damaged checkpoint that a resume passed over.
struct SkippedCheckpoint {
  std::string dir;       // RUN_DIR/checkpoints/step-NNNNNNNN
  std::string reason;    // what is damaged, naming the file
  std::string moved_to{};  // where begin_run moved it aside ("" before)
};

struct RunDir {
  std::string path;
  bool resumed = false;                     // the folder already held this run
  std::string checkpoint;                   // newest complete checkpoint to resume from ("" = from step 0)
  bool starts_over = false;                 // resumed, but no checkpoint yet: from step 0
  std::vector<SkippedCheckpoint> skipped;   // damaged checkpoints newer than `checkpoint`, newest first
  std::vector<ConfigChange> config_changes;  // against the run's config.toml (resumed only)
  std::unique_ptr<RunLock> lock;            // held by the process that writes the run
};

// A default name for a fresh run: runs/<YYYYmmdd-HHMMSS>.
std::string default_run_dir();

// The run's own config for `--resume` without `--config`: RUN_DIR/config.toml with `overrides`
// (--set) applied. Throws RunDirConflict when the folder holds no run, as open_run_dir does.
Config load_run_config(const std::string& path, const std::vector<std::string>& overrides);

// Checks what the folder holds, writing nothing. Throws RunDirConflict when it holds a run and
// opts.resume is false, holds a run of another model shape or whose config differs beyond what
// opts allow, holds other files, or (resuming) is not a run or has only damaged checkpoints.
RunDir inspect_run_dir(const std::string& path, const Config& cfg, const RunDirOptions& opts);

// inspect_run_dir, then the run's lock taken and the folder checked again under it (the state
// may have changed before the lock was ours). The returned RunDir holds the lock: keep it until
// the run ends. A folder whose lock is held by another process is refused (RunDirConflict naming
// that process) before anything is checked, so the error says why.
RunDir open_run_dir(const std::string& path, const Config& cfg, const RunDirOptions& opts);

// Resuming (rd.checkpoint set): settles rd.checkpoint on the newest checkpoint that `load`
// accepts, trying every step-* checkpoint of the run from the newest down. `load(dir)` reads
// the checkpoint and throws CorruptCheckpoint, changing nothing, when it is damaged: that one
// goes to rd.skipped, with a warning naming it and why. Every one damaged: RunDirConflict naming
// them (nothing changed). Any other error of `load` passes through, OtherModelCheckpoint too
// (an intact checkpoint of another model is refused, not passed over).
void resume_from_intact(RunDir& rd, const std::function<void(const std::string& dir)>& load);

// The run starts writing (called once the data and the checkpoint to resume from have been
// validated, so a failed start leaves the folder as it was): keeps the folder (the lock's
// commit), removes leftovers of interrupted writes (remove_leftover_writes), moves the skipped
// checkpoints aside (step-NNNNNNNN.damaged), logs the config changes and writes config.toml.
void begin_run(RunDir& rd, const Config& cfg);

// The events of a resumed run, at `step`: a `checkpoint_skipped` per damaged checkpoint passed
// over (its dir, the reason, where it was moved), then `resume` (with the checkpoint and any
// config_changes, as "key: old -> new"), or `start_over` (with its reason) for a run without a
// checkpoint yet. Nothing for a fresh run.
void record_resume(JsonlWriter& events, const RunDir& rd, int64_t step);

// Removes the "<name>.tmp-<pid>" directories that interrupted writes left in the run directory:
// under checkpoints/ every one (checkpoints are written by the run's writer, and the caller
// holds the lock, so no writer of them is left), elsewhere (an export into the folder) those
// whose process has ended. Logs each removal; returns the paths removed.
std::vector<std::string> remove_leftover_writes(const std::string& run_dir);

}  // namespace atl
