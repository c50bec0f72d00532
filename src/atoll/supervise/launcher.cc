#include "atoll/supervise/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "atoll/core/errors.h"
#include "atoll/core/timer.h"

namespace atl {

struct Supervisor::Child {
  std::string name;
  Process process;
  int out_fd = -1, metrics_fd = -1;
  std::string out_buf, metrics_buf;
  std::string last_error;
  bool judged = false;  // its bad end went to on_exit
  bool exited() const { return process.status().exited; }
};

struct Supervisor::Restart {
  double due_s = 0;
  int child = 0;
  ChildSpec spec;
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
  stop_all();  // never throws: the callbacks are guarded
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  g_signal_fd = -1;
  ::close(signal_pipe_[0]);
  ::close(signal_pipe_[1]);
}

pid_t Supervisor::pid(int child) const { return children_.at(size_t(child)).process.pid(); }

bool Supervisor::running(int child) const { return children_.at(size_t(child)).process.running(); }

const ExitStatus& Supervisor::status(int child) const { return children_.at(size_t(child)).process.status(); }

void Supervisor::kill_child(int child) { children_.at(size_t(child)).process.signal(SIGKILL); }

template <class Fn>
bool Supervisor::guarded(Fn&& fn) {
  try {
    fn();
    return true;
  } catch (...) {
    if (error_) return false;  // the first error is the one to tell; the rest follow from it
    error_ = std::current_exception();
    if (!stopping_) return false;  // run() stops every child and throws it
    try {
      throw;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "atoll: warning: while stopping the workers: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "atoll: warning: while stopping the workers: an unknown error\n");
    }
    return false;
  }
}

int Supervisor::spawn(const ChildSpec& spec) {
  Child c;
  c.name = spec.name;
  start(c, spec);
  children_.push_back(std::move(c));
  return int(children_.size()) - 1;
}

void Supervisor::close_pipes(Child& c) {
  for (auto [fd, buf, metrics] : {std::tuple{&c.out_fd, &c.out_buf, false}, std::tuple{&c.metrics_fd, &c.metrics_buf, true}}) {
    if (*fd >= 0) ::close(*fd), *fd = -1;
    if (buf->empty()) continue;
    const int index = int(&c - children_.data());
    const auto& cb = metrics ? opts_.on_metrics : opts_.on_output;
    if (cb) guarded([&, b = buf] { cb(index, *b); });  // the last, unterminated line
    buf->clear();
  }
}

void Supervisor::start(Child& c, const ChildSpec& spec) {
  int out[2], metrics[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw IoError(std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(metrics, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out[0]);
    ::close(out[1]);
    throw IoError(std::string("pipe: ") + std::strerror(e));
  }
  try {
    c.process = Process::spawn({.argv = spec.argv,
                                .env = spec.env,
                                .fds = {{out[1], 1}, {out[1], 2}, {metrics[1], 3}},
                                .death_signal = SIGKILL});
  } catch (...) {
    for (int fd : {out[0], out[1], metrics[0], metrics[1]}) ::close(fd);
    throw;
  }
  ::close(out[1]);
  ::close(metrics[1]);
  c.out_fd = out[0];
  c.metrics_fd = metrics[0];
  c.judged = false;
  c.last_error.clear();
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
        if (opts_.on_metrics) guarded([&] { opts_.on_metrics(index, line); });
      } else {
        if (line.rfind("atoll: error:", 0) == 0 || line.rfind("atoll: internal error:", 0) == 0) c.last_error = line;
        if (opts_.on_output) guarded([&] { opts_.on_output(index, line); });
      }
    });
  }
  return calm;
}

void Supervisor::reap(bool block) {
  for (Child& c : children_) block ? void(c.process.wait()) : void(c.process.poll());
}

SupervisorOutcome Supervisor::run() {
  SupervisorOutcome outcome;
  auto all_done = [&] {
    for (const Child& c : children_)
      if (!c.exited() || c.out_fd >= 0 || c.metrics_fd >= 0) return false;
    return restarts_.empty();
  };
  stopping_ = false;
  while (!error_ && !all_done()) {
    const double wait_s = restarts_.empty() ? 0.2 : std::clamp(restarts_.front().due_s - now_s(), 0.0, 0.2);
    if (!pump(int(wait_s * 1000))) {
      outcome.interrupted = true;
      outcome.signal = signal_;
      break;
    }
    reap(false);
    // A bad end: the child has exited and its output is drained (its error line read).
    for (size_t i = 0; i < children_.size() && outcome.failed < 0 && !error_; ++i) {
      Child& c = children_[i];
      if (!c.exited() || c.out_fd >= 0 || c.process.status().exit_code == 0 || c.judged) continue;
      c.judged = true;
      ExitAction a;
      if (opts_.on_exit && !guarded([&] { a = opts_.on_exit(int(i), ChildExit{c.process.status(), c.last_error}); }))
        break;
      if (a.kind == ExitAction::Kind::kFail) outcome.failed = int(i);
      if (a.kind != ExitAction::Kind::kRestart) continue;
      Restart r{.due_s = now_s() + a.delay.count() / 1000.0, .child = int(i), .spec = a.spec};
      restarts_.insert(std::upper_bound(restarts_.begin(), restarts_.end(), r,
                                        [](const Restart& x, const Restart& y) { return x.due_s < y.due_s; }),
                       r);
    }
    if (outcome.failed >= 0 || error_) break;
    while (!error_ && !restarts_.empty() && restarts_.front().due_s <= now_s()) {
      const Restart r = restarts_.front();
      restarts_.erase(restarts_.begin());
      Child& c = children_[size_t(r.child)];
      close_pipes(c);
      guarded([&] { start(c, r.spec); });  // a failed fork stops the run like a callback's error
    }
    if (opts_.on_tick && !error_) guarded(opts_.on_tick);
  }
  restarts_.clear();
  const std::exception_ptr error = error_;  // what stopped the run (errors while stopping are only reported)
  stop_all(outcome.interrupted ? std::max(opts_.signal_grace, opts_.stop_grace) : opts_.stop_grace);
  for (const Child& c : children_) outcome.children.push_back(ChildExit{c.process.status(), c.last_error});
  error_ = nullptr;
  if (error) std::rethrow_exception(error);
  return outcome;
}

void Supervisor::stop_all() { stop_all(opts_.stop_grace); }

void Supervisor::stop_all(std::chrono::milliseconds grace) {
  stopping_ = true;
  bool any = false;
  for (Child& c : children_)
    if (c.process.running()) any = true, c.process.signal(SIGTERM);
  const double deadline = now_s() + grace.count() / 1000.0;
  while (any && now_s() < deadline) {
    pump(50);  // keep draining output (a child blocked on a full pipe would never exit)
    reap(false);
    any = false;
    for (const Child& c : children_) any = any || c.process.running();
  }
  for (Child& c : children_) c.process.signal(SIGKILL);
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
