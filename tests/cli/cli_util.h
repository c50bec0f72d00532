// Helpers for the command-line tests: run the real `atoll` binary (ATOLL_BIN) with arguments,
// capturing its exit code, stdout and stderr separately under a timeout; snapshots of folders
// to prove that a failed command changed nothing; a micro model and a synthetic corpus.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "data/temp_dir.h"
#include "data/text_gen.h"

namespace atl::testing {

namespace fs = std::filesystem;

// The binary under test: $ATOLL_BIN, else `atoll` in the build folder above this test
// executable (BUILD/tests/cli_*_test -> BUILD/atoll).
inline std::string atoll_bin() {
  if (const char* bin = std::getenv("ATOLL_BIN"); bin != nullptr && *bin != '\0') return bin;
  std::error_code ec;
  const fs::path guess = fs::read_symlink("/proc/self/exe", ec).parent_path().parent_path() / "atoll";
  if (!ec && fs::is_regular_file(guess)) return guess.string();
  throw std::runtime_error("ATOLL_BIN is not set and no atoll binary next to the tests: set it to the built atoll");
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) lines.push_back(line);
  return lines;
}

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal (or timed out)
  bool timed_out = false;
  int64_t peak_rss_kb = 0;  // the child's peak resident set (getrusage's ru_maxrss, from wait4)
  std::string out, err;
  std::string command;  // for failure messages

  // The lines of stderr that report an error ("atoll: error: ...").
  std::vector<std::string> error_lines() const {
    std::vector<std::string> r;
    for (const auto& l : split_lines(err))
      if (l.rfind("atoll: error:", 0) == 0 || l.rfind("atoll: internal error:", 0) == 0) r.push_back(l);
    return r;
  }
  std::string describe() const {
    return command + "\n  exit " + std::to_string(exit_code) + (timed_out ? " (timed out)" : "") +
           "\n  stdout: " + out.substr(0, 2000) + "\n  stderr: " + err.substr(0, 4000);
  }
};

// Extra environment for every child: a private cache folder, so no test touches ~/.cache.
// "NAME=VALUE" sets NAME; a bare "NAME" removes it from the child's environment.
inline std::vector<std::string>& child_env() {
  static std::vector<std::string> env;
  return env;
}

namespace detail {

// What the child runs: argv and envp built before fork (the child only calls async-signal-safe
// functions: dup2, execve, write, _exit).
struct ExecSpec {
  std::vector<std::string> strings;  // owns the bytes
  std::vector<char*> argv, envp;
  ExecSpec(const std::vector<std::string>& args) {
    strings.push_back(atoll_bin());
    strings.insert(strings.end(), args.begin(), args.end());
    const size_t n_args = strings.size();
    std::map<std::string, std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      env[kv.substr(0, kv.find('='))] = kv;
    }
    for (const auto& kv : child_env()) {
      if (kv.find('=') == std::string::npos)
        env.erase(kv);
      else
        env[kv.substr(0, kv.find('='))] = kv;
    }
    for (const auto& [k, kv] : env) strings.push_back(kv);
    for (size_t i = 0; i < strings.size(); ++i) (i < n_args ? argv : envp).push_back(strings[i].data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
  }
};

// In the child after fork: redirect the standard streams, exec atoll.
[[noreturn]] inline void exec_child(ExecSpec& spec, int out_fd, int err_fd) {
  const int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd >= 0) ::dup2(null_fd, 0);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  ::execve(spec.argv[0], spec.argv.data(), spec.envp.data());
  const char msg[] = "exec of ATOLL_BIN failed\n";
  [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
  ::_exit(127);
}

inline std::string command_line(const std::vector<std::string>& args) {
  std::string c = "atoll";
  for (const auto& a : args) c += " " + a;
  return c;
}

}  // namespace detail

// Runs atoll with `args` to completion (or `timeout_s`, then SIGKILL).
inline RunResult run_atoll(const std::vector<std::string>& args, double timeout_s = 90.0) {
  RunResult r;
  r.command = detail::command_line(args);
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  detail::ExecSpec spec(args);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) detail::exec_child(spec, out_pipe[1], err_pipe[1]);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    const int n = ::poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[65536];
      const ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        sinks[i]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int status = 0;
  struct rusage usage {};
  while (::wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.peak_rss_kb = usage.ru_maxrss;
  return r;
}

// A running atoll whose output goes to files; for the kill-and-resume test.
class Background {
 public:
  Background(const std::vector<std::string>& args, const std::string& log_prefix) {
    const int out_fd = ::open((log_prefix + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int err_fd = ::open((log_prefix + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0 || err_fd < 0) throw std::runtime_error("cannot open the log files of " + log_prefix);
    detail::ExecSpec spec(args);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid_ == 0) detail::exec_child(spec, out_fd, err_fd);
    ::close(out_fd);
    ::close(err_fd);
  }
  ~Background() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  pid_t pid() const { return pid_; }  // -1 once reaped
  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      status_ = status;
      return false;
    }
    return true;
  }
  // SIGKILL, then reaps it; returns the wait status.
  int kill9() {
    if (pid_ > 0) ::kill(pid_, SIGKILL);
    return wait();
  }
  int wait() {
    if (pid_ > 0) {
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      status_ = status;
      pid_ = -1;
    }
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
};

// Waits until `dir/name` exists, watching `dir` with inotify (no fixed sleeps); `dir` itself
// is polled for until it exists. False on timeout or when `alive()` turns false first.
template <class Alive>
bool wait_for_file(const std::string& dir, const std::string& name, double timeout_s, Alive&& alive) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  auto left_ms = [&] {
    return static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
  };
  const int ino = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (ino < 0) throw std::runtime_error("inotify_init1 failed");
  bool found = false;
  int wd = -1;
  while (!found && left_ms() > 0) {
    if (wd < 0) wd = ::inotify_add_watch(ino, dir.c_str(), IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE);
    if (fs::exists(fs::path(dir) / name)) {  // after adding the watch, so no event is missed
      found = true;
      break;
    }
    if (!alive()) break;
    // Until the folder exists there is nothing to watch: wake up briefly to look again.
    pollfd p{ino, POLLIN, 0};
    ::poll(&p, 1, wd < 0 ? 2 : std::min(left_ms(), 200));
    char buf[4096];
    while (::read(ino, buf, sizeof buf) > 0) {
    }
  }
  ::close(ino);
  return found;
}

// Waits until the file `path` (which must exist) contains `text`, watching it with inotify (no
// fixed sleeps). False on timeout or when `alive()` turns false first.
template <class Alive>
bool wait_for_text(const std::string& path, const std::string& text, double timeout_s, Alive&& alive) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  const int ino = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (ino < 0 || ::inotify_add_watch(ino, path.c_str(), IN_MODIFY) < 0) throw std::runtime_error("cannot watch " + path);
  bool found = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (read_file(path).find(text) != std::string::npos) {  // after adding the watch: no write is missed
      found = true;
      break;
    }
    if (!alive()) break;
    pollfd p{ino, POLLIN, 0};
    ::poll(&p, 1, 200);
    char buf[4096];
    while (::read(ino, buf, sizeof buf) > 0) {
    }
  }
  ::close(ino);
  return found;
}

// Every regular file under `root` (relative path -> bytes), for before/after comparisons.
inline std::map<std::string, std::string> snapshot(const std::string& root) {
  std::map<std::string, std::string> files;
  std::error_code ec;
  if (!fs::exists(root, ec)) return files;
  if (fs::is_regular_file(root, ec)) {
    files[""] = read_file(root);
    return files;
  }
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_regular_file()) files[fs::relative(it->path(), root).string()] = read_file(it->path().string());
  }
  return files;
}

// Every file of `before` is still there with the same bytes, and no file was added.
inline ::testing::AssertionResult unchanged(const std::map<std::string, std::string>& before,
                                            const std::map<std::string, std::string>& after) {
  for (const auto& [path, bytes] : before) {
    auto it = after.find(path);
    if (it == after.end()) return ::testing::AssertionFailure() << path << " was removed";
    if (it->second != bytes)
      return ::testing::AssertionFailure()
             << path << " changed (" << bytes.size() << " -> " << it->second.size() << " bytes)";
  }
  for (const auto& [path, bytes] : after)
    if (!before.count(path)) return ::testing::AssertionFailure() << path << " was added";
  return ::testing::AssertionSuccess();
}

// The contract for bad input: a non-zero exit, one error line on stderr that contains every
// one of `must_name` (the file or flag, the key or field) and a fix.
inline ::testing::AssertionResult fails_clearly(const RunResult& r, const std::vector<std::string>& must_name) {
  if (r.timed_out) return ::testing::AssertionFailure() << "timed out: " << r.describe();
  if (r.exit_code == 0) return ::testing::AssertionFailure() << "exit code 0: " << r.describe();
  if (r.exit_code < 0) return ::testing::AssertionFailure() << "killed by a signal (crash?): " << r.describe();
  const auto lines = r.error_lines();
  if (lines.size() != 1)
    return ::testing::AssertionFailure() << lines.size() << " error lines, expected 1: " << r.describe();
  const std::string& line = lines[0];
  if (line.rfind("atoll: error: ", 0) != 0) return ::testing::AssertionFailure() << "not a user error: " << line;
  if (!r.err.ends_with(line + "\n"))  // the last line, and the message has no line breaks
    return ::testing::AssertionFailure() << "the error is not the last, whole line of stderr: " << r.describe();
  for (const auto& s : must_name)
    if (line.find(s) == std::string::npos)
      return ::testing::AssertionFailure() << "error line does not name '" << s << "': " << line;
  if (line.find("fix") == std::string::npos) return ::testing::AssertionFailure() << "error line has no fix: " << line;
  ::testing::Test::RecordProperty("error_line", line);  // in --gtest_output=xml, for review
  return ::testing::AssertionSuccess() << line;
}

// Reads a JSONL file: one object per line.
inline std::vector<nlohmann::json> parse_jsonl(const std::string& text) {
  std::vector<nlohmann::json> rows;
  for (const auto& line : split_lines(text))
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) { return parse_jsonl(read_file(path)); }

// The rows of a JSONL file another process may be appending to: a last line without its newline
// is still being written and is left for the next read (parsing it threw now and then).
inline std::vector<nlohmann::json> read_jsonl_whole_lines(const std::string& path) {
  std::string text = read_file(path);
  const size_t last_newline = text.rfind('\n');
  text.resize(last_newline == std::string::npos ? 0 : last_newline + 1);
  return parse_jsonl(text);
}

// An llm.c shard: 256 int32 header (magic, version 1, count), then uint16 tokens.
inline std::string llmc_shard(const std::vector<uint16_t>& tokens, int32_t magic = 20240520) {
  int32_t header[256] = {};
  header[0] = magic;
  header[1] = 1;
  header[2] = static_cast<int32_t>(tokens.size());
  std::string bytes(reinterpret_cast<const char*>(header), sizeof header);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return bytes;
}

// The safetensors header of a file: {name: {dtype, shape, data_offsets}} (plus __metadata__),
// and the byte offset where the data starts.
struct SafetensorsHeader {
  nlohmann::json header;
  uint64_t data_start = 0;
  uint64_t file_size = 0;
};
inline SafetensorsHeader read_safetensors_header(const std::string& path) {
  const std::string bytes = read_file(path);
  if (bytes.size() < 8) throw std::runtime_error(path + ": shorter than 8 bytes");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  if (8 + n > bytes.size()) throw std::runtime_error(path + ": header length past the end");
  return {nlohmann::json::parse(bytes.substr(8, n)), 8 + n, bytes.size()};
}

// The micro model and a synthetic corpus in a temporary folder:
//   ROOT/corpus.txt   make_docs text
//   ROOT/micro.toml   the micro config: data.input = corpus.txt, data.dir = ROOT/data
//   ROOT/data         prepared by the first `atoll train` (or prepare_data_once)
class MicroWorld {
 public:
  static constexpr int kVocab = 384, kSeqLen = 32;

  MicroWorld() {
    child_env() = {"ATOLL_CACHE_DIR=" + (dir_ / "cache"), "OMP_WAIT_POLICY=passive"};
    std::string text;
    for (const auto& d : make_docs(1500, 7)) text += d + "\n";
    write_file(corpus(), text);
    write_file(config(), config_text());
  }

  std::string root() const { return dir_.path().string(); }
  std::string path(const std::string& name) const { return dir_ / name; }
  std::string corpus() const { return dir_ / "corpus.txt"; }
  std::string config() const { return dir_ / "micro.toml"; }
  std::string data_dir() const { return dir_ / "data"; }

  // The micro config; `extra` is appended (TOML lines inside their sections are easier as --set).
  std::string config_text() const {
    return "[model]\nvocab_size = 384\ndim = 32\nn_layers = 2\nn_heads = 2\nn_kv_heads = 1\nhead_dim = 16\n"
           "n_experts = 4\ntop_k = 2\nexpert_hidden = 48\nseq_len = 32\n\n"
           "[train]\nsteps = 4\nbatch_size = 4\neval_every = 2\neval_batches = 2\nthreads = 1\n\n"
           "[optim]\nlr = 0.003\nwarmup_steps = 2\n\n"
           "[data]\ninput = [\"" +
           corpus() + "\"]\ndir = \"" + data_dir() + "\"\n\n[checkpoint]\nevery = 2\nkeep = 3\n";
  }

  // `atoll train --config micro.toml --run-dir RUN --no-sample` plus `extra` arguments.
  RunResult train(const std::string& run, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = {"train", "--config", config(), "--run-dir", run, "--no-sample"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_atoll(args);
  }

 private:
  TempDir dir_;
};

// The fixture of the command-line tests: one MicroWorld per test suite (its data prepared and a
// base run trained at most once, on first use) and a fresh folder per test.
class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { world_ = new MicroWorld(); }
  static void TearDownTestSuite() {
    delete world_;
    world_ = nullptr;
    base_run_.clear();
  }
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = world().path(std::string(info->test_suite_name()) + "." + info->name());
    fs::create_directories(dir_);
  }

  static MicroWorld& world() { return *world_; }
  // This test's own folder.
  std::string dir(const std::string& name = "") const { return name.empty() ? dir_ : dir_ + "/" + name; }

  // A run of the micro config (4 steps, checkpoints at 2 and 4), trained once per suite; read
  // only: tests that damage a run take copy_of_base_run().
  static const std::string& base_run() {
    if (base_run_.empty()) {
      const std::string run = world().path("base-run");
      const RunResult r = world().train(run);
      if (r.exit_code != 0) throw std::runtime_error("training the base run failed: " + r.describe());
      base_run_ = run;
    }
    return base_run_;
  }
  std::string copy_of_base_run(const std::string& name = "run") const {
    const std::string to = dir(name);
    fs::copy(base_run(), to, fs::copy_options::recursive);
    return to;
  }

 private:
  static inline MicroWorld* world_ = nullptr;
  static inline std::string base_run_;
  std::string dir_;
};

}  // namespace atl::testing
