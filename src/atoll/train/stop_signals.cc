#include "atoll/train/stop_signals.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/core/check.h"

namespace atl {
namespace {

std::atomic<int> g_first{0};  // the first signal, 0 while none
std::atomic<bool> g_installed{false}, g_closing{false};
std::atomic<pthread_t> g_waiter{};
std::mutex g_mutex;
std::string g_run_dir;  // guarded by g_mutex

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// In a thread that did not block the signals: hand it on to the signal thread, which has them
// blocked, so it stays pending there until its sigwait takes it (pthread_kill is
// async-signal-safe).
void hand_on(int sig) { ::pthread_kill(g_waiter.load(), sig); }

}  // namespace

StopSignals::StopSignals(double sigterm_grace_s) : sigterm_grace_s_(sigterm_grace_s) {
  ATOLL_CHECK(!g_installed.exchange(true)) << "one StopSignals at a time";
  g_first = 0;
  g_closing = false;
  set_run_dir("");
  const sigset_t set = stop_set();
  ::pthread_sigmask(SIG_BLOCK, &set, &old_mask_);
  thread_ = std::thread([this] { wait_for_signals(); });
  g_waiter = thread_.native_handle();
  struct sigaction sa {};
  sa.sa_handler = hand_on;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  g_closing = true;
  ::pthread_kill(thread_.native_handle(), SIGTERM);  // wakes its sigwait; g_closing says why
  thread_.join();
  ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  g_installed = false;
}

void StopSignals::wait_for_signals() {
  const sigset_t set = stop_set();
  auto exit_now = [](int sig, const char* why) {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::string latest;
    try {  // this thread's only call that may throw: an exception here would end in std::terminate
      latest = g_run_dir.empty() ? "" : latest_checkpoint(g_run_dir);
    } catch (const std::exception& e) {
      latest = std::string("(unknown: ") + e.what() + ")";
    }
    std::fprintf(stderr, "atoll: %s: exiting now; last complete checkpoint: %s\n", why,
                 latest.empty() ? "none" : latest.c_str());
    std::fflush(stderr);
    ::_exit(128 + sig);
  };
  std::optional<std::chrono::steady_clock::time_point> deadline;  // set by a SIGTERM with a grace
  for (;;) {
    int sig = 0;
    if (deadline) {  // the grace running: wait for a signal until it ends
      const auto left = std::max(*deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration{});
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      const timespec ts{.tv_sec = time_t(ns / 1000000000), .tv_nsec = long(ns % 1000000000)};
      sig = ::sigtimedwait(&set, nullptr, &ts);
      if (g_closing) return;
      if (sig < 0) {
        if (errno == EAGAIN) exit_now(g_first.load(), "checkpoint.grace_s ran out before the final checkpoint");
        continue;
      }
    } else if (::sigwait(&set, &sig) != 0) {
      continue;
    }
    if (g_closing) return;
    int none = 0;
    if (g_first.compare_exchange_strong(none, sig)) {
      if (sig == SIGTERM && sigterm_grace_s_ == 0) exit_now(sig, "SIGTERM with checkpoint.grace_s = 0");
      std::fprintf(stderr, "\natoll: interrupted: finishing this step and writing a checkpoint (again to exit at once)\n");
      if (sig == SIGTERM && sigterm_grace_s_ > 0)
        deadline = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(sigterm_grace_s_));
      continue;
    }
    exit_now(sig, "interrupted again");
  }
}

int StopSignals::signal() const { return g_first.load(); }

void StopSignals::set_run_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_run_dir = dir;
}

}  // namespace atl
