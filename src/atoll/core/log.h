// Logging to stderr: one line per message, prefixed with the UTC time of day and the elapsed time
// ("[14:22:03.123Z     5.52s info] ..."). Progress lines that redraw in place (on a terminal) are
// printed by train/progress.h, not here.
#pragma once

#include <string>

namespace atl {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_line(LogLevel level, const std::string& msg);

inline void log_info(const std::string& msg) { log_line(LogLevel::kInfo, msg); }
inline void log_warn(const std::string& msg) { log_line(LogLevel::kWarn, msg); }
inline void log_error(const std::string& msg) { log_line(LogLevel::kError, msg); }
inline void log_debug(const std::string& msg) { log_line(LogLevel::kDebug, msg); }

}  // namespace atl
