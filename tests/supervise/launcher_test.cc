// The Supervisor when one of its own callbacks fails (a metrics row it cannot write to a full
// disk, say): run() stops and reaps every child, then throws that error; what the callbacks throw
// while the children are stopped (their last rows) is reported, never thrown out of the
// destructor, so the process ends with one error line and not in std::terminate.
#include "atoll/supervise/launcher.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "atoll/core/errors.h"

namespace atl {
namespace {

using std::chrono::milliseconds;

bool process_exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// A child that writes a metrics row, then waits; stopped (SIGTERM), it writes one more row, as a
// worker logs the step it finishes before its final checkpoint.
ChildSpec row_then_wait(const std::string& name) {
  return {.name = name, .argv = {"sh", "-c", "trap 'echo last >&3; exit 0' TERM; echo first >&3; while :; do sleep 0.05; done"}, .env = {}};
}

TEST(Supervisor, ACallbackThatThrowsStopsEveryChildThenThrowsItsError) {
  int rows = 0;
  auto sup = std::make_unique<Supervisor>(SupervisorOptions{
      .stop_grace = milliseconds(5000),
      .on_output = {},
      .on_metrics = [&](int, const std::string& line) {
        ++rows;
        throw IoError("cannot write metrics.jsonl: disk full (row '" + line + "')");
      }});
  const int a = sup->spawn(row_then_wait("a"));
  const int b = sup->spawn(row_then_wait("b"));
  const pid_t pa = sup->pid(a), pb = sup->pid(b);
  try {
    sup->run();
    FAIL() << "run() returned although a callback threw";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("disk full (row 'first')"), std::string::npos) << e.what();
  }
  // Every child is stopped and reaped before the error comes out.
  EXPECT_FALSE(sup->running(a));
  EXPECT_FALSE(sup->running(b));
  EXPECT_FALSE(process_exists(pa));
  EXPECT_FALSE(process_exists(pb));
  EXPECT_GE(rows, 2) << "the rows written while stopping went to the callback too";
  sup.reset();  // nothing left to stop; must not throw
}

// Whether `pid` catches SIGTERM yet (its shell has set the trap): SigCgt in /proc/PID/status.
bool catches_sigterm(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("SigCgt:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> (SIGTERM - 1)) & 1;
  return false;
}

TEST(Supervisor, TheDestructorReportsWhatCallbacksThrowWhileItStopsTheChildren) {
  int rows = 0;
  {
    Supervisor sup({.stop_grace = milliseconds(5000), .on_output = {}, .on_metrics = [&](int, const std::string&) {
                      ++rows;
                      throw IoError("cannot write metrics.jsonl: disk full");
                    }});
    const pid_t pid = sup.pid(sup.spawn(row_then_wait("a")));
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!catches_sigterm(pid) && std::chrono::steady_clock::now() < end) std::this_thread::yield();
    ASSERT_TRUE(catches_sigterm(pid));
  }  // stop_all in the destructor: both rows throw; neither may escape (std::terminate)
  EXPECT_EQ(rows, 2);
}

}  // namespace
}  // namespace atl
