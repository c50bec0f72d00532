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
//   - it continues from the newest complete checkpoint; a run without a checkpoint yet (stopped
//     before its first) starts over from step 0, saying so in the log and with a `start_over`
//     event; checkpoints that are all damaged are an error (starting over would replace them).
#pragma once

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
};

struct RunDir {
  std::string path;
  bool resumed = false;                     // the folder already held this run
  std::string checkpoint;                   // newest complete checkpoint to resume from ("" = from step 0)
  bool starts_over = false;                 // resumed, but no checkpoint yet: from step 0
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

// The run starts writing (called once the data and the checkpoint to resume from have been
// validated, so a failed start leaves the folder as it was): keeps the folder (the lock's
// commit), removes leftovers of interrupted writes (remove_leftover_writes), logs the config
// changes and writes config.toml.
void begin_run(RunDir& rd, const Config& cfg);

// The events of a resumed run, at `step`: `resume` (with the checkpoint and any config_changes,
// as "key: old -> new"), or `start_over` (with its reason) for a run without a checkpoint yet.
// Nothing for a fresh run.
void record_resume(JsonlWriter& events, const RunDir& rd, int64_t step);

// Removes the "<name>.tmp-<pid>" directories that interrupted writes left in the run directory:
// under checkpoints/ every one (checkpoints are written by the run's writer, and the caller
// holds the lock, so no writer of them is left), elsewhere (an export into the folder) those
// whose process has ended. Logs each removal; returns the paths removed.
std::vector<std::string> remove_leftover_writes(const std::string& run_dir);

}  // namespace atl
