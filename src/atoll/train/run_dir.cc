#include "atoll/train/run_dir.h"

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/core/errors.h"
#include "atoll/core/file_writer.h"
#include "atoll/core/log.h"

namespace atl {
namespace fs = std::filesystem;

std::string default_run_dir() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return std::string("runs/") + buf;
}

namespace {
std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The first [model] key whose value differs, as "model.dim is 32 there, 64 here".
std::string model_difference(const ModelConfig& there, const ModelConfig& here) {
  std::istringstream a(model_config_to_toml(there)), b(model_config_to_toml(here));
  std::string la, lb;
  while (std::getline(a, la) && std::getline(b, lb)) {
    if (la == lb) continue;
    const size_t eq = la.find(" = ");
    if (eq == std::string::npos || lb.compare(0, eq + 3, la, 0, eq + 3) != 0) break;
    return "model." + la.substr(0, eq) + " is " + la.substr(eq + 3) + " there, " + lb.substr(eq + 3) + " here";
  }
  return "[model] differs";
}

}  // namespace

RunDir inspect_run_dir(const std::string& path, const Config& cfg, bool resume) {
  RunDir rd;
  rd.path = path;
  const std::string cfg_path = path + "/config.toml";
  if (fs::exists(path) && !fs::is_directory(path))
    throw RunDirConflict(path + ": --run-dir is a file, not a folder; fix: choose another --run-dir");
  const bool has_run = fs::exists(cfg_path);
  if (!has_run && fs::exists(path) && !fs::is_empty(path) && !resume)
    throw RunDirConflict(path + ": folder is not empty and holds no atoll run (no config.toml); fix: choose an empty or new --run-dir");
  if (has_run) {
    Config old;
    try {
      old = parse_config(read_file(cfg_path), cfg_path);
    } catch (const ConfigError& e) {
      throw RunDirConflict(std::string(e.what()) + " (the run directory holds a config this atoll cannot read; fix: choose a new --run-dir)");
    }
    if (model_config_to_toml(old.model) != model_config_to_toml(cfg.model))
      throw RunDirConflict(path + " holds a run of another model shape (" + cfg_path + ": " +
                           model_difference(old.model, cfg.model) +
                           "); fix: choose a new --run-dir, or resume with that run's config");
    if (!resume)
      throw RunDirConflict(path + " already holds a run (" + cfg_path + "); fix: pass --resume to continue it, or choose a new --run-dir");
    rd.resumed = true;
    rd.checkpoint = latest_checkpoint(path);
    rd.config_changed = config_to_toml(cfg) != read_file(cfg_path);
  }
  return rd;
}

void write_run_config(const RunDir& rd, const Config& cfg) {
  if (rd.config_changed) log_warn("resuming " + rd.path + " with changed settings; config.toml updated");
  fs::create_directories(rd.path + "/checkpoints");
  write_file_atomic(rd.path + "/config.toml", config_to_toml(cfg));  // IoError with the reason ("disk full")
}

}  // namespace atl
