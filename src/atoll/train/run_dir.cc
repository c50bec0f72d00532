#include "atoll/train/run_dir.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/core/errors.h"
#include "atoll/core/file_writer.h"
#include "atoll/core/log.h"
#include "atoll/core/stale_temp.h"

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

// Whether events.jsonl holds the event a run writes first: `start` (atoll train, a worker that
// owns its folder) or `launch` (atoll launch), as event_row writes them (a number "time").
bool has_start_event(const std::string& path) {
  std::ifstream f(path + "/events.jsonl");
  for (std::string line; std::getline(f, line);) {
    const nlohmann::json e = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (e.is_object() && e.contains("time") && e["time"].is_number() &&
        (e.value("event", "") == "start" || e.value("event", "") == "launch"))
      return true;
  }
  return false;
}

// The traces of an atoll run beside its config.toml: checkpoints/ (begin_run makes it before it
// writes config.toml) or the run's first event. A config.toml alone (a copy of a config among the
// user's own files) is not a run.
bool has_run_traces(const std::string& path) {
  return fs::is_directory(path + "/checkpoints") || has_start_event(path);
}

// --resume continues a run: the folder must exist and hold config.toml and the traces of a run.
void expect_a_run(const std::string& path) {
  const std::string fix = "; fix: check the --run-dir path, or leave out --resume to start a new run";
  if (!fs::exists(path)) throw RunDirConflict(path + " does not exist: --resume continues the run in --run-dir" + fix);
  if (!fs::exists(path + "/config.toml"))
    throw RunDirConflict(path + " holds no atoll run (no config.toml): --resume continues the run in --run-dir" + fix);
  if (!has_run_traces(path))
    throw RunDirConflict(path + " holds a config.toml but no atoll run (no checkpoints/, no start event in "
                         "events.jsonl): --resume continues the run in --run-dir" + fix + " in an empty folder");
}

// Whether the folder holds nothing but what a start that never began its run may leave: its lock.
bool empty_but_lock(const std::string& path) {
  for (const auto& e : fs::directory_iterator(path))
    if (e.path().filename() != kRunLockFile) return false;
  return true;
}

// The run's config differences that opts allow, or a RunDirConflict naming those it does not.
std::vector<ConfigChange> allowed_changes(const std::string& cfg_path, const Config& old, const Config& cfg,
                                          const RunDirOptions& opts) {
  std::vector<ConfigChange> changes = config_changes(old, cfg), refused;
  for (const ConfigChange& c : changes)
    if (c.model()) refused.push_back(c);
  if (!refused.empty()) {
    const ConfigChange& c = refused.front();
    throw RunDirConflict(fs::path(cfg_path).parent_path().string() + " holds a run of another model shape (" + cfg_path +
                         ": " + c.key + " is " + c.was + " there, " + c.now +
                         " here); fix: choose a new --run-dir, or resume with that run's config");
  }
  if (!opts.resume || opts.allow_config_change) return changes;
  for (const ConfigChange& c : changes)
    if (!c.safe()) refused.push_back(c);
  if (refused.empty()) return changes;
  std::string what;
  for (const ConfigChange& c : refused) what += (what.empty() ? "" : ", ") + c.key + " (" + c.was + " there, " + c.now + " here)";
  throw RunDirConflict("--resume would change " + what + " of the run in " + cfg_path + "; only " +
                       resume_safe_keys_text() +
                       " may change on --resume; fix: leave the change out, start a new --run-dir, or pass "
                       "--allow-config-change to change it on purpose");
}

// The step-* checkpoint directories of the run (complete or not; not the temporary ones).
std::vector<std::string> checkpoint_dirs(const std::string& path) {
  std::vector<std::string> dirs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path + "/checkpoints", ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step-", 0) == 0 && name.find(".tmp") == std::string::npos) dirs.push_back(name);
  }
  return dirs;
}

}  // namespace

Config load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  expect_a_run(path);
  return load_config(path + "/config.toml", overrides);
}

RunDir inspect_run_dir(const std::string& path, const Config& cfg, const RunDirOptions& opts) {
  RunDir rd;
  rd.path = path;
  const std::string cfg_path = path + "/config.toml";
  if (fs::exists(path) && !fs::is_directory(path))
    throw RunDirConflict(path + ": --run-dir is a file, not a folder; fix: choose another --run-dir");
  if (opts.resume) expect_a_run(path);
  const bool has_run = fs::exists(cfg_path) && has_run_traces(path);
  if (!has_run && fs::exists(path) && !empty_but_lock(path))
    throw RunDirConflict(path + ": folder is not empty and holds no atoll run (" +
                         (fs::exists(cfg_path) ? "a config.toml, but no checkpoints/ and no start event in events.jsonl"
                                               : "no config.toml") +
                         "); fix: choose an empty or new --run-dir");
  if (!has_run) return rd;
  Config old;
  try {
    old = parse_config(read_file(cfg_path), cfg_path);
  } catch (const ConfigError& e) {
    throw RunDirConflict(std::string(e.what()) + " (the run directory holds a config this atoll cannot read; fix: choose a new --run-dir)");
  }
  rd.config_changes = allowed_changes(cfg_path, old, cfg, opts);
  if (!opts.resume)
    throw RunDirConflict(path + " already holds a run (" + cfg_path + "); fix: pass --resume to continue it, or choose a new --run-dir");
  rd.resumed = true;
  rd.checkpoint = latest_checkpoint(path);
  if (rd.checkpoint.empty()) {
    const std::vector<std::string> dirs = checkpoint_dirs(path);
    if (!dirs.empty())
      throw RunDirConflict(path + "/checkpoints holds " + dirs.front() + (dirs.size() > 1 ? " and more" : "") +
                           " but no complete checkpoint (no valid manifest.json); fix: move the damaged checkpoints "
                           "away to start the run over, or put back a complete one");
    rd.starts_over = true;
  }
  return rd;
}

void resume_from_intact(RunDir& rd, const std::function<void(const std::string& dir)>& load) {
  if (rd.checkpoint.empty()) return;
  std::vector<std::pair<int64_t, std::string>> steps;  // every step-* checkpoint, newest first
  for (const std::string& name : checkpoint_dirs(rd.path))
    if (int64_t step = 0; parse_step_name(name, &step))
      steps.emplace_back(step, (fs::path(rd.path) / "checkpoints" / name).string());
  std::sort(steps.rbegin(), steps.rend());
  rd.skipped.clear();
  for (const auto& [step, dir] : steps) {
    try {
      load(dir);
    } catch (const OtherModelCheckpoint&) {
      throw;  // not damage: refused, as a config of another model is
    } catch (const CorruptCheckpoint& e) {
      std::string why = e.what();
      why = why.substr(0, why.find("; fix:"));  // the fix of one file does not apply to the run
      rd.skipped.push_back({.dir = dir, .reason = why});
      log_warn(dir + " is damaged (" + why + "): skipped, it is kept; trying the checkpoint before it");
      continue;
    }
    rd.checkpoint = dir;
    if (!rd.skipped.empty()) log_warn("resuming from " + dir + ", the newest intact checkpoint of " + rd.path);
    return;
  }
  std::string what;
  for (const SkippedCheckpoint& s : rd.skipped) what += (what.empty() ? "" : "; ") + s.reason;
  throw RunDirConflict("every checkpoint of " + rd.path + "/checkpoints is damaged (" + what +
                       "); nothing was changed; fix: put back the damaged files (a backup, or a copy from the machine "
                       "that wrote them), or start a fresh --run-dir");
}

RunDir open_run_dir(const std::string& path, const Config& cfg, const RunDirOptions& opts) {
  // A lock file present: its holder, if any, is the reason to refuse; taking it changes nothing
  // in the folder (the lock puts a taken-over file back when the start fails).
  std::unique_ptr<RunLock> lock;
  if (fs::is_directory(path) && fs::exists(path + "/" + kRunLockFile)) lock = std::make_unique<RunLock>(path);
  RunDir rd = inspect_run_dir(path, cfg, opts);
  if (!lock) {
    lock = std::make_unique<RunLock>(path);
    rd = inspect_run_dir(path, cfg, opts);  // another process may have started a run meanwhile
  }
  if (!lock->stale_holder().empty())
    log_warn("took over the stale lock of " + path + " left by atoll " + lock->stale_holder() +
             " (that process has ended)");
  rd.lock = std::move(lock);
  if (opts.verify_checkpoint)
    resume_from_intact(rd, [&cfg](const std::string& dir) { verify_checkpoint(dir, cfg.model); });
  return rd;
}

void begin_run(RunDir& rd, const Config& cfg) {
  if (rd.lock) rd.lock->commit();
  remove_leftover_writes(rd.path);
  if (!rd.config_changes.empty()) {
    std::string what;
    for (const ConfigChange& c : rd.config_changes) what += (what.empty() ? "" : ", ") + c.text();
    log_info("resuming " + rd.path + " with changed settings (" + what + "); config.toml updated");
  }
  if (rd.starts_over)
    log_warn(rd.path + " holds no checkpoint yet (the run stopped before its first): starting over from step 0");
  // Out of the way of this run's saves and prunes, which would replace or remove it.
  for (SkippedCheckpoint& s : rd.skipped) {
    std::string to = s.dir + ".damaged";
    for (int i = 2; fs::exists(to); ++i) to = s.dir + ".damaged-" + std::to_string(i);
    std::error_code ec;
    fs::rename(s.dir, to, ec);
    if (ec) throw_io_error("move the damaged checkpoint aside to " + to + ":", s.dir, ec.value());
    s.moved_to = to;
    log_warn("moved the damaged checkpoint " + s.dir + " aside to " + to + " (kept for recovery)");
  }
  fs::create_directories(rd.path + "/checkpoints");
  write_file_atomic(rd.path + "/config.toml", config_to_toml(cfg));  // IoError with the reason ("disk full")
}

void record_resume(JsonlWriter& events, const RunDir& rd, int64_t step) {
  if (!rd.resumed) return;
  nlohmann::json changes = nlohmann::json::array();
  for (const ConfigChange& c : rd.config_changes) changes.push_back(c.text());
  for (const SkippedCheckpoint& s : rd.skipped)
    events.write(event_row("checkpoint_skipped", {{"checkpoint", s.dir}, {"reason", s.reason}, {"moved_to", s.moved_to}}));
  nlohmann::json e = rd.starts_over
                         ? event_row("start_over", {{"reason", "--resume found no checkpoint in " + rd.path +
                                                                   " (the run stopped before its first): starting "
                                                                   "over from step 0"}})
                         : event_row("resume", {{"step", step}, {"checkpoint", rd.checkpoint}});
  if (!changes.empty()) e["config_changes"] = changes;
  events.write(e);
}

std::vector<std::string> remove_leftover_writes(const std::string& run_dir) {
  std::vector<std::string> leftovers;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(run_dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::optional<int64_t> pid = temp_owner(it->path().filename().string());
    if (!it->is_directory() || !pid) continue;
    it.disable_recursion_pending();  // its contents go with it
    const bool checkpoint = it.depth() == 1 && it->path().parent_path().filename() == "checkpoints";
    if (checkpoint || !process_alive(*pid)) leftovers.push_back(it->path().string());
  }
  for (const std::string& dir : leftovers) {
    fs::remove_all(dir, ec);
    log_info("removed " + dir + ", left by an interrupted write");
  }
  return leftovers;
}

}  // namespace atl
