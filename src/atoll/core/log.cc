#include "atoll/core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "atoll/core/timer.h"

namespace atl {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_mu;
const double g_start = now_s();
}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_line(LogLevel level, const std::string& msg) {
  if (static_cast<int>(level) < g_level.load()) return;
  static const char* kTags[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "[%8.2fs %s] %s\n", now_s() - g_start, kTags[static_cast<int>(level)], msg.c_str());
  std::fflush(stderr);
}

}  // namespace atl
