// One child process: the single fork/exec path of atoll, used by the Supervisor (the workers of
// `atoll launch`) and by RedisServer (the private redis-server).
//
// Every child
//   - runs argv with the inherited environment plus `env` ("KEY=VALUE", replacing a variable of
//     the same name); argv[0] without a '/' is looked up on PATH;
//   - has stdin on /dev/null, and the parent's descriptors listed in `fds` on the numbers given
//     (stdout and stderr to a pipe or a log file, say; every other descriptor atoll opens is
//     close-on-exec, so the child inherits nothing else);
//   - runs in its own process group, so a Ctrl-C at the terminal reaches the parent only, which
//     then stops its children in order;
//   - gets `death_signal` when the thread that spawned it ends (PR_SET_PDEATHSIG), so no child
//     outlives a parent that is killed outright;
//   - has SIGINT and SIGTERM at their default actions, whatever handlers the parent installed.
// spawn() returns once the child has run exec: a failed exec (no such file, not executable)
// comes back through a close-on-exec pipe and is thrown as ExecFailed, so the caller sees the
// reason instead of a child that exits 127.
//
// The Process object owns the child: only the process that spawned it signals, waits for or
// reaps it. A copy of the object in a child forked without exec (a test's worker process, say)
// does nothing, so such a fork never stops its parent's server.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "atoll/core/errors.h"

namespace atl {

struct ProcessSpec {
  std::vector<std::string> argv = {};         // argv[0]: a path, or a name looked up on PATH
  std::vector<std::string> env = {};          // "KEY=VALUE" added to (or replacing in) the inherited environment
  std::vector<std::pair<int, int>> fds = {};  // {parent's fd, child's fd}: what the child sees on 1, 2, 3, ...
  int death_signal = SIGKILL;                 // sent to the child when the spawning thread ends
};

// How a child ended.
struct ExitStatus {
  bool exited = false;  // reaped
  int exit_code = -1;   // -1 when ended by a signal
  int signal = 0;
  std::string describe() const;  // "exit 1" | "signal 9"
};

// exec of the child's argv[0] failed; `error` is its errno.
class ExecFailed : public Error {
 public:
  ExecFailed(const std::string& what, int error) : Error(what), error(error) {}
  int error;
};

class Process {
 public:
  Process() = default;
  // Throws IoError if a pipe or fork fails, ExecFailed if exec fails.
  static Process spawn(const ProcessSpec& spec);
  ~Process();  // a child still running (in the owner) gets SIGKILL and is reaped
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !status_.exited; }  // spawned and not yet reaped
  const ExitStatus& status() const { return status_; }

  void signal(int sig);                                    // nothing once reaped
  std::optional<ExitStatus> poll();                         // reaps without blocking; nullopt while running
  ExitStatus wait();                                        // blocks until it ends
  bool wait_for(std::chrono::milliseconds timeout);         // true once it has ended (and is reaped)
  // SIGTERM, up to `grace` for it to end, then SIGKILL; reaps. Idempotent.
  ExitStatus terminate(std::chrono::milliseconds grace);

 private:
  bool owned() const;  // spawned by this process (not a copy in a forked child)
  void kill_now();     // SIGKILL and reap a child still running
  void record(int wait_status);

  pid_t pid_ = -1;
  pid_t owner_ = -1;
  ExitStatus status_;
};

}  // namespace atl
