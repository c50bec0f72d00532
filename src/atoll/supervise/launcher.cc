#include "atoll/supervise/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "atoll/core/errors.h"
#include "atoll/core/timer.h"

extern char** environ;

namespace atl {

struct Supervisor::Child {
  std::string name;
  pid_t pid = -1;
  int out_fd = -1, metrics_fd = -1;
  std::string out_buf, metrics_buf;
  ChildExit exit;
};

namespace {

// SIGINT / SIGTERM to the supervisor: written to a self-pipe that run() polls.
int g_signal_fd = -1;
void on_signal(int sig) {
  if (g_signal_fd >= 0) {
    const unsigned char b = static_cast<unsigned char>(sig);
    [[maybe_unused]] ssize_t n = ::write(g_signal_fd, &b, 1);
  }
}

// Splits complete lines off `buf`, passing each to `fn`.
template <class Fn>
void take_lines(std::string& buf, Fn&& fn) {
  size_t start = 0;
  for (size_t nl; (nl = buf.find('\n', start)) != std::string::npos; start = nl + 1) fn(buf.substr(start, nl - start));
  buf.erase(0, start);
}

}  // namespace

std::string ChildExit::describe() const {
  return exit_code >= 0 ? "exit " + std::to_string(exit_code) : "signal " + std::to_string(signal);
}

std::string self_executable() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

Supervisor::Supervisor(SupervisorOptions opts) : opts_(std::move(opts)) {
  if (::pipe2(signal_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  g_signal_fd = signal_pipe_[1];
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

Supervisor::~Supervisor() {
  stop_all();
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  g_signal_fd = -1;
  ::close(signal_pipe_[0]);
  ::close(signal_pipe_[1]);
}

pid_t Supervisor::pid(int child) const { return children_.at(size_t(child)).pid; }

int Supervisor::spawn(const ChildSpec& spec) {
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> strings = spec.argv;
  const size_t n_args = strings.size();
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    env[kv.substr(0, kv.find('='))] = kv;
  }
  for (const auto& kv : spec.env) env[kv.substr(0, kv.find('='))] = kv;
  for (const auto& [k, kv] : env) strings.push_back(kv);
  std::vector<char*> argv, envp;
  for (size_t i = 0; i < strings.size(); ++i) (i < n_args ? argv : envp).push_back(strings[i].data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);

  int out[2], metrics[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(metrics, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw Error(std::string("pipe: ") + std::strerror(errno));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // the supervisor died before prctl
    struct sigaction sa {};
    sa.sa_handler = SIG_DFL;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::dup2(metrics[1], 3);  // dup2 clears FD_CLOEXEC on the copy
    ::execve(argv[0], argv.data(), envp.data());
    const char msg[] = "atoll: error: exec of the worker failed\n";
    [[maybe_unused]] ssize_t n = ::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(metrics[1]);
  Child c;
  c.name = spec.name;
  c.pid = pid;
  c.out_fd = out[0];
  c.metrics_fd = metrics[0];
  children_.push_back(std::move(c));
  return int(children_.size()) - 1;
}

bool Supervisor::pump(int timeout_ms) {
  std::vector<pollfd> fds{{signal_pipe_[0], POLLIN, 0}};
  std::vector<std::pair<int, bool>> who{{-1, false}};  // child, is metrics
  for (size_t i = 0; i < children_.size(); ++i) {
    if (children_[i].out_fd >= 0) fds.push_back({children_[i].out_fd, POLLIN, 0}), who.push_back({int(i), false});
    if (children_[i].metrics_fd >= 0) fds.push_back({children_[i].metrics_fd, POLLIN, 0}), who.push_back({int(i), true});
  }
  const int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n <= 0) return true;
  bool calm = true;
  if (fds[0].revents & POLLIN) {
    unsigned char sig = 0;
    if (::read(signal_pipe_[0], &sig, 1) == 1) signal_ = sig;
    calm = false;
  }
  for (size_t k = 1; k < fds.size(); ++k) {
    if (!fds[k].revents) continue;
    Child& c = children_[size_t(who[k].first)];
    const bool is_metrics = who[k].second;
    int& fd = is_metrics ? c.metrics_fd : c.out_fd;
    std::string& buf = is_metrics ? c.metrics_buf : c.out_buf;
    char data[65536];
    const ssize_t got = ::read(fd, data, sizeof data);
    if (got < 0 && errno == EINTR) continue;
    if (got > 0) buf.append(data, size_t(got));
    else {
      ::close(fd);
      fd = -1;
      if (!buf.empty() && buf.back() != '\n') buf += '\n';  // the last, unterminated line
    }
    const int index = who[k].first;
    take_lines(buf, [&](const std::string& line) {
      if (is_metrics) {
        if (opts_.on_metrics) opts_.on_metrics(index, line);
      } else {
        if (line.rfind("atoll: error:", 0) == 0 || line.rfind("atoll: internal error:", 0) == 0) c.exit.last_error = line;
        if (opts_.on_output) opts_.on_output(index, line);
      }
    });
  }
  return calm;
}

void Supervisor::reap(bool block) {
  for (Child& c : children_) {
    if (c.pid < 0 || c.exit.exited) continue;
    int status = 0;
    pid_t r;
    while ((r = ::waitpid(c.pid, &status, block ? 0 : WNOHANG)) < 0 && errno == EINTR) {
    }
    if (r != c.pid) continue;
    c.exit.exited = true;
    c.exit.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    c.exit.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  }
}

SupervisorOutcome Supervisor::run() {
  SupervisorOutcome outcome;
  auto all_done = [&] {
    for (const Child& c : children_)
      if (!c.exit.exited || c.out_fd >= 0 || c.metrics_fd >= 0) return false;
    return true;
  };
  while (!all_done()) {
    if (!pump(200)) {
      outcome.interrupted = true;
      outcome.signal = signal_;
      break;
    }
    reap(false);
    // A failure: the child has exited badly and its output is drained (its error line read).
    for (size_t i = 0; i < children_.size(); ++i) {
      const Child& c = children_[i];
      if (c.exit.exited && c.out_fd < 0 && (c.exit.exit_code != 0)) {
        outcome.failed = int(i);
        break;
      }
    }
    if (outcome.failed >= 0) break;
  }
  stop_all();
  for (const Child& c : children_) outcome.children.push_back(c.exit);
  return outcome;
}

void Supervisor::stop_all() {
  bool any = false;
  for (Child& c : children_)
    if (c.pid > 0 && !c.exit.exited) any = true, ::kill(c.pid, SIGTERM);
  const double deadline = now_s() + opts_.stop_grace.count() / 1000.0;
  while (any && now_s() < deadline) {
    pump(50);  // keep draining output (a child blocked on a full pipe would never exit)
    reap(false);
    any = false;
    for (const Child& c : children_) any = any || (c.pid > 0 && !c.exit.exited);
  }
  for (Child& c : children_)
    if (c.pid > 0 && !c.exit.exited) ::kill(c.pid, SIGKILL);
  reap(true);
  // Whatever the children wrote before they ended.
  for (int guard = 0; guard < 1000; ++guard) {
    bool open = false;
    for (const Child& c : children_) open = open || c.out_fd >= 0 || c.metrics_fd >= 0;
    if (!open) break;
    pump(50);
  }
}

}  // namespace atl
