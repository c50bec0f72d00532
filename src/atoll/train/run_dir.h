// The run directory (DESIGN.md "Files"): config.toml, metrics.jsonl, events.jsonl,
// checkpoints/, tokenizer.model. Opening one either starts a fresh run in an empty or new
// folder, or continues the run it holds (--resume); it never mixes two runs in one folder.
#pragma once

#include <string>

#include "atoll/config/config.h"

namespace atl {

struct RunDir {
  std::string path;
  bool resumed = false;        // the folder already held this run
  std::string checkpoint;      // newest complete checkpoint to resume from ("" = start fresh)
  bool config_changed = false; // resuming with settings that differ from config.toml
};

// A default name for a fresh run: runs/<YYYYmmdd-HHMMSS>.
std::string default_run_dir();

// Checks what the folder holds, writing nothing. Throws RunDirConflict when it holds a run and
// `resume` is false, holds a run of another model shape, or holds other files.
RunDir inspect_run_dir(const std::string& path, const Config& cfg, bool resume);

// Creates the folder and writes config.toml: called once the data and the checkpoint to
// resume from have been validated, so a failed start leaves the folder as it was.
void write_run_config(const RunDir& rd, const Config& cfg);

}  // namespace atl
