// Local process supervision for `atoll launch`: supervise/ watches processes from outside. The
// Supervisor spawns child processes (process.h: own process group, PR_SET_PDEATHSIG = SIGKILL, so
// no child outlives a supervisor that is killed outright), streams their output and their metrics
// rows, and stops them all.
//
// Every child gets
//   stdin  /dev/null
//   stdout and stderr  one pipe, read by the supervisor line by line (on_output)
//   fd 3   the write end of its own metrics pipe, read line by line (on_metrics)
// A Ctrl-C at the terminal reaches the supervisor only (the children are in their own process
// groups), which then stops the children in order.
//
// run() returns when every child has exited, or at the first child that fails (a non-zero exit
// or a signal: the others are stopped), or when the supervisor gets SIGINT or SIGTERM (every
// child is stopped, with `signal_grace`: time for workers to write a final checkpoint).
// Stopping: SIGTERM, then SIGKILL after `stop_grace`; partial lines are flushed to the
// callbacks, and every child is reaped.
//
// Restarts: with on_exit set, a child that ends badly (its output drained) is the policy's to
// judge: fail (as above), ignore it (it counts as ended), or restart it after a delay with a new
// command line, in the same slot (its index, name and callbacks stay; its pipes are new), while
// the others go on. on_tick runs after every wake-up (at most 200 ms apart), for policies that
// watch time, and may stop a child with kill_child().
//
// Errors of the callbacks (a metrics row that cannot be written to a full disk, a store that
// cannot be restarted): the first exception any callback throws stops the run as a failed child
// would: every child is stopped and reaped, then run() throws that exception. While the
// children are being stopped (after a failure, an interrupt, or in the destructor), callbacks go
// on being called, and what they throw then is reported on stderr as one line and otherwise
// dropped, so no exception ever escapes the destructor (no std::terminate) and no child is left.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "atoll/supervise/process.h"

namespace atl {

struct ChildSpec {
  std::string name;               // for messages: "island 1 rank 0"
  std::vector<std::string> argv;  // argv[0]: the executable's path
  std::vector<std::string> env;   // "KEY=VALUE" added to (or replacing in) the inherited environment
};

struct ChildExit : ExitStatus {
  std::string last_error;  // the child's last output line that starts with "atoll: error:"
};

struct SupervisorOutcome {
  bool interrupted = false;  // SIGINT/SIGTERM to the supervisor stopped the children
  int signal = 0;            // which one
  int failed = -1;           // index of the first child that failed, -1 if none
  std::vector<ChildExit> children;
};

// What to do about a child that ended badly.
struct ExitAction {
  enum class Kind { kFail, kIgnore, kRestart };
  Kind kind = Kind::kFail;
  std::chrono::milliseconds delay{0};  // kRestart: after this long
  ChildSpec spec{};                    // kRestart: the new command line
};

struct SupervisorOptions {
  std::chrono::milliseconds stop_grace{5000};
  std::chrono::milliseconds signal_grace{5000};  // stop_grace after SIGINT/SIGTERM to the supervisor
  std::function<void(int child, const std::string& line)> on_output;   // a whole line, no '\n'
  std::function<void(int child, const std::string& line)> on_metrics;  // a whole line, no '\n'
  std::function<ExitAction(int child, const ChildExit& exit)> on_exit{};  // unset: every bad end fails
  std::function<void()> on_tick{};
};

class Supervisor {
 public:
  explicit Supervisor(SupervisorOptions opts);
  ~Supervisor();  // stops and reaps any child still running
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts a child; returns its index. Throws IoError if fork or pipe fails, ExecFailed if exec does.
  int spawn(const ChildSpec& spec);
  // Throws the first exception of a callback, once every child is stopped (see above), or an
  // IoError of a restart's fork.
  SupervisorOutcome run();
  void stop_all();  // SIGTERM, stop_grace, SIGKILL; reaps every child
  void stop_all(std::chrono::milliseconds grace);
  pid_t pid(int child) const;
  bool running(int child) const;  // spawned and not yet reaped (a restart pending is not running)
  const ExitStatus& status(int child) const;  // of its newest process
  void kill_child(int child);     // SIGKILL (a stopped child too); run() reaps it and asks on_exit

 private:
  struct Child;
  struct Restart;
  bool pump(int timeout_ms);  // reads what is ready; false when a signal arrived
  void reap(bool block);
  void start(Child& c, const ChildSpec& spec);  // fork/exec with fresh pipes
  void close_pipes(Child& c);                   // flushing partial lines to the callbacks
  // Calls a callback; an exception it throws is kept in error_ (the first) or reported (later).
  template <class Fn>
  bool guarded(Fn&& fn);
  SupervisorOptions opts_;
  std::vector<Child> children_;
  std::vector<Restart> restarts_;  // pending, in order of due time
  int signal_pipe_[2] = {-1, -1};
  int signal_ = 0;  // the last SIGINT/SIGTERM received
  std::exception_ptr error_;  // the first exception a callback threw
  bool stopping_ = false;     // in stop_all: errors are reported, not thrown
};

// The path of the running executable (/proc/self/exe resolved), for spawning itself.
std::string self_executable();

}  // namespace atl
