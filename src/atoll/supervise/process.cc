// Spawning, signalling and reaping one child process (see process.h for what the child gets).
#include "atoll/supervise/process.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

extern char** environ;

namespace atl {

namespace {

using Clock = std::chrono::steady_clock;

// The child's environment: the inherited one with `extra` added or replacing by name.
std::vector<std::string> child_environment(const std::vector<std::string>& extra) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    env[kv.substr(0, kv.find('='))] = kv;
  }
  for (const auto& kv : extra) env[kv.substr(0, kv.find('='))] = kv;
  std::vector<std::string> out;
  for (auto& [k, kv] : env) out.push_back(std::move(kv));
  return out;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  for (auto& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

// In the child, between fork and exec: only async-signal-safe calls. Does not return.
[[noreturn]] void exec_child(const ProcessSpec& spec, pid_t parent, int err_fd, char** argv, char** envp) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, spec.death_signal);
  if (::getppid() != parent) ::_exit(1);  // the parent died before prctl
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  const int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd >= 0) ::dup2(null_fd, 0);
  for (const auto& [from, to] : spec.fds) ::dup2(from, to);  // dup2 clears FD_CLOEXEC on the copy
  ::execvpe(argv[0], argv, envp);
  const int e = errno;
  [[maybe_unused]] ssize_t w = ::write(err_fd, &e, sizeof(e));
  ::_exit(127);
}

}  // namespace

std::string ExitStatus::describe() const {
  return exit_code >= 0 ? "exit " + std::to_string(exit_code) : "signal " + std::to_string(signal);
}

Process Process::spawn(const ProcessSpec& spec) {
  if (spec.argv.empty()) throw Error("spawn: empty argv");
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> args = spec.argv, env = child_environment(spec.env);
  std::vector<char*> argv = pointers(args), envp = pointers(env);

  // exec failures come back through a close-on-exec pipe: EOF means exec succeeded.
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw IoError(std::string("pipe: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    throw IoError(std::string("fork: ") + std::strerror(e));
  }
  if (pid == 0) exec_child(spec, parent, err_pipe[1], argv.data(), envp.data());
  ::close(err_pipe[1]);
  Process p;
  p.pid_ = pid;
  p.owner_ = parent;
  int exec_errno = 0;
  ssize_t got;
  do got = ::read(err_pipe[0], &exec_errno, sizeof(exec_errno));
  while (got < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof(exec_errno))) {
    p.wait();
    throw ExecFailed("cannot run '" + spec.argv[0] + "': " + std::strerror(exec_errno), exec_errno);
  }
  return p;
}

Process::~Process() { kill_now(); }

void Process::kill_now() {
  if (running() && owned()) {
    ::kill(pid_, SIGKILL);
    wait();
  }
}

Process::Process(Process&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), owner_(other.owner_), status_(other.status_) {}

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    kill_now();
    pid_ = std::exchange(other.pid_, -1);
    owner_ = other.owner_;
    status_ = other.status_;
  }
  return *this;
}

bool Process::owned() const { return pid_ > 0 && ::getpid() == owner_; }

void Process::record(int wait_status) {
  status_.exited = true;
  status_.exit_code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
  status_.signal = WIFSIGNALED(wait_status) ? WTERMSIG(wait_status) : 0;
}

void Process::signal(int sig) {
  if (running() && owned()) ::kill(pid_, sig);
}

std::optional<ExitStatus> Process::poll() {
  if (running() && owned()) {
    int st = 0;
    pid_t r;
    while ((r = ::waitpid(pid_, &st, WNOHANG)) < 0 && errno == EINTR) {
    }
    if (r == pid_) record(st);
  }
  if (status_.exited) return status_;
  return std::nullopt;
}

ExitStatus Process::wait() {
  if (running() && owned()) {
    int st = 0;
    pid_t r;
    while ((r = ::waitpid(pid_, &st, 0)) < 0 && errno == EINTR) {
    }
    if (r == pid_) record(st);
  }
  return status_;
}

// A pidfd makes the wait an event; kernels without pidfd_open fall back to polling waitpid.
bool Process::wait_for(std::chrono::milliseconds timeout) {
  if (!running() || !owned()) return status_.exited;
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(timeout.count()));
    ::close(pidfd);
    return poll().has_value();
  }
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (poll()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return poll().has_value();
}

ExitStatus Process::terminate(std::chrono::milliseconds grace) {
  if (!running() || !owned()) return status_;
  signal(SIGTERM);
  if (!wait_for(grace)) {
    signal(SIGKILL);
    wait();
  }
  return status_;
}

}  // namespace atl
