#include "atoll/ckpt/checkpoint.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "atoll/ckpt/file_io.h"
#include "atoll/ckpt/safetensors.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/fault_injection.h"
#include "atoll/core/log.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace atl {
namespace {

constexpr char kManifest[] = "manifest.json";
constexpr char kFixOlder[] =
    "fix: restore the file, or use another checkpoint of the run (`--resume` falls back to the newest intact one "
    "by itself)";

// [model] keys that steer training but not the weights' shapes; a run may resume with other
// values (e.g. a different load-balancing coefficient; a longer context with a new RoPE base:
// context extension, which `--resume` accepts as a logged change).
const std::set<std::string> kTrainingOnlyModelKeys = {"init_std",    "init_seed", "aux_loss_coef",
                                                      "z_loss_coef", "seq_len",   "rope_theta"};

std::string join(const std::string& a, const std::string& b) { return (fs::path(a) / b).string(); }

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

[[noreturn]] void corrupt(const std::string& where, const std::string& problem, const std::string& fix = kFixOlder) {
  throw CorruptCheckpoint("checkpoint " + where + ": " + problem + "; " + fix);
}

}  // namespace

bool parse_step_name(const std::string& name, int64_t* step) {
  // At most 18 digits, so the number cannot overflow (a name is read from checkpoints/latest).
  if (name.size() < 13 || name.size() > 5 + 18 || name.compare(0, 5, "step-") != 0) return false;
  int64_t s = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    s = s * 10 + (name[i] - '0');
  }
  *step = s;
  return true;
}

namespace {

bool is_complete(const std::string& dir) {
  try {
    read_checkpoint_manifest(dir);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Complete step-* checkpoints under `ckdir`, newest first.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& ckdir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(ckdir, ec)) {
    int64_t step = 0;
    const std::string name = e.path().filename().string();
    if (parse_step_name(name, &step) && is_complete(e.path().string())) out.emplace_back(step, name);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

void check_buffers(const ParamLayout& layout, const std::vector<CheckpointBuffer>& buffers) {
  std::set<std::string> kinds;
  for (const auto& b : buffers) {
    ATOLL_CHECK(!b.kind.empty() && b.kind.find('/') == std::string::npos) << "bad buffer kind '" << b.kind << "'";
    ATOLL_CHECK(kinds.insert(b.kind).second) << "buffer kind '" << b.kind << "' given twice";
    ATOLL_CHECK(b.data != nullptr || layout.total() == 0) << "buffer '" << b.kind << "' has no data";
  }
}

// Removes complete checkpoints beyond `keep`; the new one counts and is never removed. A
// failure here does not undo the save, so it is logged, not thrown.
void prune(const std::string& ckdir, int keep, const std::string& new_name) {
  if (keep <= 0) return;
  int kept = 1;  // the new one
  for (const auto& [step, name] : complete_checkpoints(ckdir)) {
    if (name == new_name) continue;
    if (kept < keep) {
      ++kept;
      continue;
    }
    try {
      remove_all(join(ckdir, name));
    } catch (const IoError& e) {
      log_warn(std::string("could not remove old checkpoint: ") + e.what());
    }
  }
}

// "key = value" lines of a TOML section, by key.
std::map<std::string, std::string> toml_values(const std::string& text) {
  std::map<std::string, std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    size_t eq = line.find(" = ");
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 3);
    pos = end + 1;
  }
  return out;
}

// Compares the saved [model] with the expected one key by key. Both go through ModelConfig and
// model_config_to_toml, so formatting and keys added since the save (at their defaults) do not
// count as differences, and no list of model fields is kept here.
void check_same_model(const json& manifest, const ModelConfig& expected, const std::string& dir) {
  ModelConfig saved;
  try {
    saved = parse_config(manifest.at("model").get<std::string>(), join(dir, kManifest) + " (model)").model;
  } catch (const ConfigError& e) {
    corrupt(dir, std::string("its [model] section does not parse: ") + e.what());
  }
  auto there = toml_values(model_config_to_toml(saved));
  for (const auto& [key, here] : toml_values(model_config_to_toml(expected))) {
    if (kTrainingOnlyModelKeys.count(key) || there[key] == here) continue;
    throw OtherModelCheckpoint("checkpoint " + dir + " is from another model shape: model." + key + " is " + there[key] +
                            " there, " + here + " here; fix: use the matching config or a fresh --run-dir");
  }
}

// A manifest field of the expected JSON type, or CorruptCheckpoint naming it.
const json& field(const json& j, const std::string& key, json::value_t type, const std::string& where) {
  auto it = j.find(key);
  bool ok = it != j.end() && (it->type() == type || (type == json::value_t::number_integer && it->is_number_integer()));
  if (!ok) corrupt(where, "field '" + key + "' is missing or not " + json(type).type_name());
  return *it;
}

// A tensor's shape in the manifest: a list of sizes.
std::vector<int64_t> shape_field(const json& meta, const std::string& where) {
  const json& j = field(meta, "shape", json::value_t::array, where);
  std::vector<int64_t> shape;
  for (const json& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) corrupt(where, "shape holds " + d.dump() + ", not a size");
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

// The path of a file the manifest names: a plain name inside `dir` (no folder part, "." or
// "..", and a symbolic link only to a file inside `dir`), so a manifest cannot make a reader
// open files elsewhere.
std::string file_in_checkpoint(const std::string& dir, const std::string& file, const std::string& mpath) {
  if (file.empty() || file == "." || file == ".." || file.find_first_of(std::string("/\0", 2)) != std::string::npos)
    corrupt(mpath, "file name '" + file + "' is not a plain file name inside the checkpoint");
  const std::string path = join(dir, file);
  std::error_code ec;
  if (fs::is_symlink(path, ec)) {
    const fs::path target = fs::weakly_canonical(path, ec), home = fs::weakly_canonical(dir, ec);
    if (ec || target.parent_path() != home)
      corrupt(mpath, "file '" + file + "' is a symbolic link out of the checkpoint folder");
  }
  return path;
}

// One file of the checkpoint, checked against the manifest's size before it is parsed, so a
// truncated file is reported as such (naming it) rather than as a bad header.
const SafetensorsReader& open_file(std::map<std::string, SafetensorsReader>& open, const json& manifest,
                                   const std::string& dir, const std::string& file) {
  auto it = open.find(file);
  if (it != open.end()) return it->second;
  const std::string mpath = join(dir, kManifest);
  const json& files = field(manifest, "files", json::value_t::object, mpath);
  if (!files.contains(file)) corrupt(mpath, "file '" + file + "' is not listed under 'files'");
  const uint64_t want = field(files.at(file), "bytes", json::value_t::number_integer, mpath + " files." + file).get<uint64_t>();
  const std::string path = file_in_checkpoint(dir, file, mpath);
  std::error_code ec;
  const uint64_t have = fs::file_size(path, ec);
  if (ec) corrupt(path, "cannot be read (" + ec.message() + ")");
  if (have != want)
    corrupt(path, "file is " + std::to_string(have) + " bytes, the manifest says " + std::to_string(want) +
                      (have < want ? " (truncated)" : " (damaged)"));
  return open.emplace(file, SafetensorsReader::open(path)).first->second;
}

// Finds tensor `name` (shape `shape`), checks it against the manifest, its file and its
// checksum, and returns its bytes.
std::span<const std::byte> checked_tensor(std::map<std::string, SafetensorsReader>& files, const json& manifest,
                                          const std::string& dir, const std::string& name,
                                          const std::vector<int64_t>& shape) {
  const std::string mpath = join(dir, kManifest);
  const json& index = field(manifest, "tensors", json::value_t::object, mpath);
  if (!index.contains(name)) corrupt(dir, "has no tensor '" + name + "'");
  const json& meta = index.at(name);
  const std::string where = mpath + " tensors." + name;
  const std::string file = field(meta, "file", json::value_t::string, where).get<std::string>();
  const auto saved_shape = shape_field(meta, where);
  if (saved_shape != shape || field(meta, "dtype", json::value_t::string, where).get<std::string>() != "F32")
    corrupt(dir, "tensor '" + name + "' has shape " + shape_string(saved_shape) + ", expected F32 " + shape_string(shape));
  const SafetensorsReader& r = open_file(files, manifest, dir, file);
  const std::string stored =
      meta.contains("stored_as") ? field(meta, "stored_as", json::value_t::string, where).get<std::string>() : name;
  const TensorInFile* t = r.find(stored);
  const uint64_t offset = field(meta, "offset", json::value_t::number_integer, where).get<uint64_t>();
  if (!t || t->shape != shape || t->dtype != "F32" || t->file_offset != offset)
    corrupt(r.path(), "tensor '" + name + "' is missing or differs from the manifest");
  std::span<const std::byte> bytes = r.view(stored);
  const std::string sum = hex64(XXH3_64bits(bytes.data(), bytes.size()));
  const std::string want = field(meta, "xxh3", json::value_t::string, where).get<std::string>();
  if (sum != want)
    corrupt(r.path(), "tensor '" + name + "' fails its checksum (xxh3 " + sum + ", manifest " + want + ")");
  return bytes;
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08" PRId64, step);
  return buf;
}

std::string checkpoint_part_name(int writer) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", writer);
  return buf;
}

std::string checkpoint_temp_dir(const std::string& run_dir, int64_t step, uint64_t token) {
  return join(join(run_dir, "checkpoints"), checkpoint_dir_name(step) + ".tmp-" + std::to_string(token));
}

json write_checkpoint_part(const std::string& dir, int writer, const std::vector<PartTensor>& tensors) {
  const std::string file = checkpoint_part_name(writer);
  make_dirs(dir);
  std::vector<TensorToWrite> out;
  for (const PartTensor& t : tensors) out.push_back({t.name, "F32", t.shape, t.data, t.numel * sizeof(float)});
  const std::vector<TensorInFile> where = write_safetensors(
      join(dir, file), out, {.metadata = {}, .fsync = true, .after_tensor = [](size_t i) {
        if (i == 0) fault_checkpoint("tensor");
      }});
  fault_checkpoint("part");
  json index = json::object();
  for (size_t i = 0; i < out.size(); ++i) {
    const auto& t = out[i];
    index[t.name] = {{"file", file},
                     {"offset", where[i].file_offset},
                     {"shape", t.shape},
                     {"dtype", t.dtype},
                     {"xxh3", hex64(XXH3_64bits(t.data, t.bytes))}};
  }
  return {{"file", file}, {"rank", writer}, {"bytes", fs::file_size(join(dir, file))}, {"tensors", index}};
}

json write_only_checkpoint_part(const std::string& dir, const std::vector<PartTensor>& tensors) {
  remove_all(dir);
  try {
    return write_checkpoint_part(dir, 0, tensors);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    throw;
  }
}

std::string commit_checkpoint(const CommitOptions& opts, const Config& cfg, const std::vector<json>& parts,
                              const json& state) {
  ATOLL_CHECK_GE(opts.step, 0);
  ATOLL_CHECK(opts.islands >= 1 && opts.workers_per_island >= 1 && opts.entries.is_object());
  const std::string ckdir = join(opts.run_dir, "checkpoints");
  const std::string name = checkpoint_dir_name(opts.step);
  const std::string final_dir = join(ckdir, name);
  try {
    json files = json::object(), tensors = json::object();
    for (const json& part : parts) {
      files[part.at("file").get<std::string>()] = {{"rank", part.at("rank")}, {"bytes", part.at("bytes")}};
      for (const auto& [t, meta] : part.at("tensors").items()) tensors[t] = meta;
    }
    for (const auto& [alias, target] : opts.aliases) {
      ATOLL_CHECK(tensors.contains(target)) << "alias " << alias << " of unwritten tensor " << target;
      tensors[alias] = tensors[target];
      tensors[alias]["stored_as"] = target;  // its name in the file
    }
    json manifest = {{"format_version", kCheckpointFormatVersion},
                     {"step", opts.step},
                     {"world_size", parts.size()},
                     {"islands", opts.islands},
                     {"workers_per_island", opts.workers_per_island},
                     {"config", config_to_toml(cfg)},
                     {"model", model_config_to_toml(cfg.model)},
                     {"files", files},
                     {"tensors", tensors},
                     {"entries", opts.entries},
                     {"state", state}};
    write_text_file(join(opts.temp_dir, kManifest), manifest.dump(1) + "\n", /*sync=*/true);
    fsync_dir(opts.temp_dir);
    fault_checkpoint("manifest");
    publish_dir(opts.temp_dir, final_dir);
  } catch (...) {
    // Leave no partial directory behind; the previous checkpoints stay as they were.
    std::error_code ec;
    fs::remove_all(opts.temp_dir, ec);
    throw;
  }
  fault_checkpoint("rename");
  write_text_file_atomic(join(ckdir, "latest"), name + "\n");
  fault_checkpoint("latest");
  prune(ckdir, opts.keep, name);
  return final_dir;
}

std::string save_checkpoint(const SaveOptions& opts, const Config& cfg, const ParamLayout& layout,
                            const std::vector<CheckpointBuffer>& buffers, const json& state) {
  check_buffers(layout, buffers);
  ATOLL_CHECK_EQ(layout.total(), ParamLayout::build(cfg.model).total()) << "layout does not match cfg.model";
  const std::string tmp = checkpoint_temp_dir(opts.run_dir, opts.step, uint64_t(::getpid()));
  std::vector<PartTensor> tensors;
  for (const auto& b : buffers)
    for (const auto& e : layout.entries()) tensors.push_back({b.kind + "/" + e.name, e.shape, b.data + e.offset, e.numel});
  const json part = write_only_checkpoint_part(tmp, tensors);
  return commit_checkpoint({.run_dir = opts.run_dir,
                            .temp_dir = tmp,
                            .step = opts.step,
                            .keep = opts.keep,
                            .islands = opts.islands,
                            .workers_per_island = opts.workers_per_island,
                            .entries = opts.entries},
                           cfg, {part}, state);
}

json read_checkpoint_manifest(const std::string& dir) {
  const std::string path = join(dir, kManifest);
  std::error_code ec;
  if (!fs::exists(path, ec))
    corrupt(dir, "has no manifest.json, so it is not a complete checkpoint (an interrupted write?)",
            "fix: resume from another checkpoint; checkpoints/latest names the newest complete one");
  json m = json::parse(read_text_file(path), nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) corrupt(path, "is not valid JSON");
  const auto version = field(m, "format_version", json::value_t::number_integer, path).get<int64_t>();
  if (version < kOldestCheckpointFormat || version > kCheckpointFormatVersion)
    corrupt(path, "format_version is " + std::to_string(version) + ", this build reads " +
                      std::to_string(kOldestCheckpointFormat) + " to " + std::to_string(kCheckpointFormatVersion),
            "fix: use the atoll version that wrote it");
  field(m, "step", json::value_t::number_integer, path);
  field(m, "config", json::value_t::string, path);
  field(m, "model", json::value_t::string, path);
  field(m, "files", json::value_t::object, path);
  field(m, "tensors", json::value_t::object, path);
  if (!m.contains("state")) corrupt(path, "field 'state' is missing");
  if (version >= 2) {
    for (const char* key : {"islands", "workers_per_island"})
      if (field(m, key, json::value_t::number_integer, path).get<int64_t>() < 1)
        corrupt(path, std::string("field '") + key + "' is below 1");
    field(m, "entries", json::value_t::object, path);
    field(m, "state", json::value_t::object, path);
  }
  return m;
}

json load_checkpoint(const std::string& dir, const ModelConfig& expected, const ParamLayout& layout,
                     const std::vector<CheckpointBuffer>& buffers) {
  check_buffers(layout, buffers);
  ATOLL_CHECK_EQ(layout.total(), ParamLayout::build(expected).total()) << "layout does not match the expected model";
  const json manifest = read_checkpoint_manifest(dir);
  check_same_model(manifest, expected, dir);
  // Validate every tensor (files, shapes, checksums) before touching the caller's buffers, so
  // a bad checkpoint leaves them as they were.
  std::map<std::string, SafetensorsReader> files;
  std::vector<std::pair<float*, std::span<const std::byte>>> staged;
  for (const auto& b : buffers)
    for (const auto& e : layout.entries())
      staged.emplace_back(b.data + e.offset, checked_tensor(files, manifest, dir, b.kind + "/" + e.name, e.shape));
  for (auto& [dst, src] : staged)
    if (!src.empty()) std::memcpy(dst, src.data(), src.size());
  return manifest.at("state");
}

void verify_checkpoint(const std::string& dir, const ModelConfig& expected) {
  check_same_model(read_checkpoint_manifest(dir), expected, dir);
  verify_checkpoint_files(dir);
}

void verify_checkpoint_files(const std::string& dir) {
  const json manifest = read_checkpoint_manifest(dir);
  std::map<std::string, SafetensorsReader> files;
  const std::string mpath = join(dir, kManifest);
  for (const auto& [name, meta] : manifest.at("tensors").items()) {
    checked_tensor(files, manifest, dir, name, shape_field(meta, mpath + " tensors." + name));
  }
}

std::string latest_checkpoint(const std::string& run_dir) {
  const std::string ckdir = join(run_dir, "checkpoints");
  const std::string latest = join(ckdir, "latest");
  std::error_code ec;
  if (fs::exists(latest, ec)) {
    std::string name = read_text_file(latest);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    int64_t step = 0;
    if (parse_step_name(name, &step) && is_complete(join(ckdir, name))) return join(ckdir, name);
    log_warn(latest + " names '" + name.substr(0, 80) + "', which is not a complete checkpoint; using the newest complete one");
  }
  auto all = complete_checkpoints(ckdir);
  return all.empty() ? "" : join(ckdir, all.front().second);
}

std::string resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (fs::exists(join(path, kManifest), ec)) return path;
  std::string latest = latest_checkpoint(path);
  if (latest.empty())
    corrupt(path, "is neither a checkpoint (no manifest.json) nor a run directory with a complete checkpoint",
            "fix: pass RUN_DIR/checkpoints/step-NNNNNNNN or a run directory that has one");
  return latest;
}

Config read_checkpoint_config(const std::string& dir) {
  const json m = read_checkpoint_manifest(dir);
  try {
    return parse_config(m.at("config").get<std::string>(), join(dir, kManifest) + " (config)");
  } catch (const ConfigError& e) {
    corrupt(dir, std::string("its saved config does not parse: ") + e.what(),
            "fix: use the atoll version that wrote it");
  }
}

}  // namespace atl
