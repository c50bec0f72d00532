#include "atoll/core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "atoll/core/timer.h"

namespace atl {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_mu;
const double g_start = now_s();

// "14:22:03.123Z": the UTC time of day, so that the lines of a launch's workers (each with its own
// elapsed time) can be put in one order, and matched with events.jsonl's "time".
void utc_time_of_day(char* out, size_t n) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  std::snprintf(out, n, "%02d:%02d:%02d.%03dZ", tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
}
}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_line(LogLevel level, const std::string& msg) {
  if (static_cast<int>(level) < g_level.load()) return;
  static const char* kTags[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(g_mu);
  char clock[32];  // read under the lock, so the lines of one process are in time order
  utc_time_of_day(clock, sizeof(clock));
  std::fprintf(stderr, "[%s %8.2fs %s] %s\n", clock, now_s() - g_start, kTags[static_cast<int>(level)], msg.c_str());
  std::fflush(stderr);
}

}  // namespace atl
