// Training-state checkpoints (DESIGN.md, "Files"): one format for every kind of run. A
// single-process `atoll train` is a run of 1 island x 1 worker and writes exactly what
// `atoll launch --islands 1 --workers-per-island 1` writes, so either command resumes the other's
// checkpoints where the shapes agree. On disk:
//
//   RUN_DIR/checkpoints/step-00000030/
//     rank-00000.safetensors   one file per worker (rank-<global worker index>), each holding its
//     rank-00001.safetensors   share of the tensors "<kind>/<param name>" (e.g. "param/layers.0.
//     ...                      attn.wq", "adam_m/embed"), fp32, their real shapes (no padding)
//     manifest.json            written last; its presence makes the directory a checkpoint
//   RUN_DIR/checkpoints/latest  the name of the newest complete checkpoint ("step-00000030")
//
// manifest.json (format_version 3):
//   {"format_version": 3, "step": 30, "world_size": 4,             the number of rank files
//    "islands": 2, "workers_per_island": 2,          the run's shape (1 x 1 for `atoll train`)
//    "config": "<full resolved TOML>", "model": "<[model] section TOML>",
//    "files": {"rank-00000.safetensors": {"rank": 0, "bytes": 123456}, "rank-00001...": ...},
//    "tensors": {"param/embed": {"file": "rank-00000.safetensors", "offset": 1024,
//                                "shape": [64, 16], "dtype": "F32", "xxh3": "<16 hex>"}, ...},
//    "entries": {"param": {"type": "tensor", "owner": "engine", "division": "replicated_in_island",
//                          "copies": 2}, "loaders": {"type": "json", ...}, ...},
//    "state": {"step": 30, "tokens": ..., "loaders": [cursor of worker 0, of worker 1, ...], ...}}
// "offset" is the absolute byte offset of the tensor's data in its file. A tensor that stands
// for another's bytes (a missing island's copy, see below) also has "stored_as": its name in the
// file. Version 3 added "stored_as" and files from every worker (version 2 wrote rank 0 only and
// reads the same way). "entries" lists every
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
// One safetensors file per writing rank (ckpt/checkpoint_plan.h): every worker w (global index
// island * workers_per_island + rank) writes "rank-<w>.safetensors" into the same temporary
// directory, holding the layout entries the plan gives it: its share of its island's copy of each
// entry kept per island (the island's M ranks write one copy between them, in parallel) and its
// share of the run-wide entries (θ, outer momentum: split over every worker). Each part is
// fsynced; its index ({file, bytes, tensors}) goes to one committer (the lowest live worker), which
// writes the manifest (the union of the indexes) last. "files" then lists every rank file and
// "world_size" their number; a missing island's copy (an elastic run) names the same file and
// offset as the first live island's. Because the manifest indexes tensors by name, a checkpoint
// loads on any number of ranks and any shape. A file that is shorter than the manifest says
// (zero bytes, truncated) or fails a checksum is refused naming it.
//
// Commit order: the parts written and fsynced -> manifest.json written and fsynced -> the
// directory "step-NNNNNNNN.tmp-<token>/" fsynced and renamed to "step-NNNNNNNN/", its parent
// fsynced -> "latest" replaced atomically -> older checkpoints beyond `keep` removed. A crash at
// any point leaves the previous checkpoints and "latest" valid; the temporary directory left
// behind is removed by the next start (train/run_dir.h remove_leftover_writes, run by the
// run-directory lock holder).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/model/layout.h"

namespace atl {

inline constexpr int kCheckpointFormatVersion = 3;  // what this build writes
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

// "step-00000030" -> 30; false for any other name (temporary and moved-aside directories).
bool parse_step_name(const std::string& name, int64_t* step);

// "rank-00003.safetensors": the part written by global worker 3.
std::string checkpoint_part_name(int writer);

// Where the parts of step `step` are written before the commit: RUN_DIR/checkpoints/
// step-NNNNNNNN.tmp-<token>, the token a number every writer of the save agrees on.
std::string checkpoint_temp_dir(const std::string& run_dir, int64_t step, uint64_t token);

// One tensor of a part: a whole layout entry of one kind ("param/embed", "island1_adam_m/...").
struct PartTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
  size_t numel = 0;
};

// Writes checkpoint_part_name(writer) into `dir` (created if missing) and fsyncs it. Returns the
// part's index: {"file", "bytes", "tensors": {name: {file, offset, shape, dtype, xxh3}}}.
// Throws IoError on write failures.
nlohmann::json write_checkpoint_part(const std::string& dir, int writer, const std::vector<PartTensor>& tensors);

// The part of a save's only writer (writer 0: a single-process run), into `dir`, which is its
// alone: whatever is there is removed first (left by a crash of an earlier process with the same
// token), and `dir` is removed again when the write fails, before the error goes on, so that a
// full disk keeps no partial checkpoint (the space its error asks to free).
nlohmann::json write_only_checkpoint_part(const std::string& dir, const std::vector<PartTensor>& tensors);

struct CommitOptions {
  std::string run_dir, temp_dir;  // temp_dir: where every part was written
  int64_t step = 0;
  int keep = 3;  // as SaveOptions::keep
  int islands = 1, workers_per_island = 1;
  nlohmann::json entries = nlohmann::json::object();
  // Tensor names that stand for another's bytes: {alias: name} (a missing island's copy).
  std::map<std::string, std::string> aliases{};
};

// The commit of a sharded save, once every part is durable: the manifest (the parts' indexes
// merged, plus `state`) written last and fsynced into temp_dir, which is then published as
// step-NNNNNNNN, then "latest" moved to it and old checkpoints pruned. Returns the directory.
// On failure the temporary directory is removed and the previous checkpoints are untouched.
std::string commit_checkpoint(const CommitOptions& opts, const Config& cfg, const std::vector<nlohmann::json>& parts,
                              const nlohmann::json& state);

// Saves the buffers and `state` as the checkpoint of opts.step and returns its directory: one
// writer's part and the commit, at once (single-process tools and tests).
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

// The same checks of the files alone (the manifest, every tensor's file size, shape, dtype and
// checksum), whatever model it holds: whether checkpoint `dir` is intact. Reads every tensor once.
void verify_checkpoint_files(const std::string& dir);

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
