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
};

// A default name for a fresh run: runs/<YYYYmmdd-HHMMSS>.
std::string default_run_dir();

// Creates or opens the run directory and writes config.toml. Throws RunDirConflict when the
// folder holds a run and `resume` is false, or holds a run of another model shape, and
// CorruptCheckpoint when the checkpoint to resume from fails verify_checkpoint; the folder is
// left untouched then.
RunDir open_run_dir(const std::string& path, const Config& cfg, bool resume);

}  // namespace atl
