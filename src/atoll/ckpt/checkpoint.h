// Training-state checkpoints (DESIGN.md, "Files"): one format for every kind of run. A
// single-process `atoll train` is a run of 1 island x 1 worker and writes exactly what
// `atoll launch --islands 1 --workers-per-island 1` writes, so either command resumes the other's
// checkpoints where the shapes agree. On disk:
//
//   RUN_DIR/checkpoints/step-00000030/
//     rank-00000.safetensors   tensors "<kind>/<param name>" (e.g. "param/layers.0.attn.wq",
//                              "adam_m/embed"), fp32, their real shapes (no layout padding)
//     manifest.json            written last; its presence makes the directory a checkpoint
//   RUN_DIR/checkpoints/latest  the name of the newest complete checkpoint ("step-00000030")
//
// manifest.json (format_version 2):
//   {"format_version": 2, "step": 30, "world_size": 1,
//    "islands": 2, "workers_per_island": 2,          the run's shape (1 x 1 for `atoll train`)
//    "config": "<full resolved TOML>", "model": "<[model] section TOML>",
//    "files": {"rank-00000.safetensors": {"rank": 0, "bytes": 123456}},
//    "tensors": {"param/embed": {"file": "rank-00000.safetensors", "offset": 1024,
//                                "shape": [64, 16], "dtype": "F32", "xxh3": "<16 hex>"}, ...},
//    "entries": {"param": {"type": "tensor", "owner": "engine", "division": "replicated_in_island",
//                          "copies": 2}, "loaders": {"type": "json", ...}, ...},
//    "state": {"step": 30, "tokens": ..., "loaders": [cursor of worker 0, of worker 1, ...], ...}}
// "offset" is the absolute byte offset of the tensor's data in its file. "entries" lists every
// piece of training state saved, as the state registry (train/state_registry.h) declares it:
// what it is ("tensor": a flat fp32 buffer in the layout, saved per layout entry; "json": a
// value in "state"), who owns it and how it divides among ranks. A tensor entry saved once per
// island ("copies" = islands) names island 0's copy "<entry>/<param name>" and island i's
// "island<i>_<entry>/<param name>", so readers of the parameters (`atoll eval`, `generate`,
// `export`) read "param/..." from any checkpoint. A JSON entry divided per worker is a list by
// global worker index w = island * workers_per_island + rank; per island, a list by island;
// run-wide, the value itself.
//
// Version 1 (before the registry) is still read: its single-process kind ("state": {"step",
// "tokens", "optimizer_step", "loader"}) and its multi-island kind ("state" also holding
// "loaders", "islands", "workers_per_island", "fragments", ...) are upgraded on reading
// (train/state_registry.h read_training_manifest); the tensors' names are the same.
//
// One safetensors file per writing rank: a sharded writer has each rank write the tensors it
// owns into its own rank-NNNNN file inside the same temporary directory, and one rank write
// the manifest (the union of the index) last. Because the manifest indexes tensors by name,
// a checkpoint loads on any number of ranks. This version writes rank 0 only.
//
// Writes go to "step-NNNNNNNN.tmp-<pid>/", are fsynced, then the directory is renamed into
// place, then "latest" is replaced atomically, then older checkpoints beyond `keep` are
// removed. A crash at any point leaves the previous checkpoints and "latest" valid.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/model/layout.h"

namespace atl {

inline constexpr int kCheckpointFormatVersion = 2;  // what this build writes
inline constexpr int kOldestCheckpointFormat = 1;   // the oldest it reads

// One flat fp32 buffer of layout.total() elements laid out by the ParamLayout, saved under
// "<kind>/<param name>". Kinds are short names without '/': "param", "adam_m", "adam_v",
// "muon_m", "diloco_theta", "diloco_momentum"... Save only reads `data`.
struct CheckpointBuffer {
  std::string kind;
  float* data = nullptr;
};

struct SaveOptions {
  std::string run_dir;
  int64_t step = 0;
  int keep = 3;  // complete checkpoints kept after this save, the new one included; <= 0 keeps all
  int islands = 1, workers_per_island = 1;                // the run's shape
  nlohmann::json entries = nlohmann::json::object();      // what is saved (see above)
};

// "step-00000030".
std::string checkpoint_dir_name(int64_t step);

// Saves the buffers and `state` as the checkpoint of opts.step and returns its directory.
// An existing checkpoint of the same step is replaced. Throws IoError on write failures (the
// previous checkpoints and "latest" are then unchanged).
std::string save_checkpoint(const SaveOptions& opts, const Config& cfg, const ParamLayout& layout,
                            const std::vector<CheckpointBuffer>& buffers, const nlohmann::json& state);

// Loads checkpoint `dir` into `buffers` (each kind must be in the checkpoint; tensors of other
// kinds are ignored) and returns the saved state. Validates first, then copies, so on any
// error the buffers are unchanged. Throws CorruptCheckpoint naming the file and the field or
// tensor: missing or unparseable manifest, another model ([model] differs; see below),
// missing tensor or wrong shape, a file of the wrong size (truncated), a checksum mismatch.
// The [model] keys that only steer training (init_std, init_seed, aux_loss_coef, z_loss_coef)
// may differ; every other key must match.
nlohmann::json load_checkpoint(const std::string& dir, const ModelConfig& expected, const ParamLayout& layout,
                               const std::vector<CheckpointBuffer>& buffers);

// Checks checkpoint `dir` as load_checkpoint does (manifest, [model] against `expected`, and
// every tensor it lists: its file's size, shape, dtype and xxh3 checksum) without loading it,
// so a caller can refuse a bad checkpoint before it changes anything. Reads every tensor once.
// Throws CorruptCheckpoint as load_checkpoint does.
void verify_checkpoint(const std::string& dir, const ModelConfig& expected);

// The newest complete checkpoint of a run: the directory named by checkpoints/latest if it
// holds a valid manifest, else the highest step-* directory that does; "" if none.
std::string latest_checkpoint(const std::string& run_dir);

// A checkpoint directory from a user's path: `path` itself if it holds manifest.json, else
// latest_checkpoint(path) when `path` is a run directory. CorruptCheckpoint if neither.
std::string resolve_checkpoint(const std::string& path);

// The parsed and shape-checked manifest (CorruptCheckpoint naming manifest.json and the field
// if absent or malformed), of any format version from kOldestCheckpointFormat on, as written
// (train/state_registry.h read_training_manifest upgrades a version-1 one).
nlohmann::json read_checkpoint_manifest(const std::string& dir);

// The full resolved config saved with the checkpoint (for eval, generate, export).
Config read_checkpoint_config(const std::string& dir);

}  // namespace atl
