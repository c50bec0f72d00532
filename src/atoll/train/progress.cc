#include "atoll/train/progress.h"

#include <unistd.h>

#include <cstdio>

#include "atoll/core/timer.h"

namespace atl {

Progress::Progress(std::string label, int64_t total_steps, int64_t first_step)
    : label_(std::move(label)), total_(total_steps), first_(first_step), tty_(::isatty(STDOUT_FILENO)), start_(now_s()) {}

std::string Progress::format_duration(double s) {
  if (s < 0 || s > 1e8) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", long(t / 3600), long(t / 60 % 60), long(t % 60));
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", long(t / 60), long(t % 60));
  return buf;
}

void Progress::update(int64_t step, const std::string& fields) {
  const double now = now_s(), elapsed = now - start_;
  const bool last = step >= total_;
  // Terminal: redraw at most 10 times a second. Logs: a line every 10 s, plus the first and last.
  const double interval = tty_ ? 0.1 : 10.0;
  if (!last && step > first_ + 1 && now - last_print_ < interval) return;
  last_print_ = now;
  const double eta = step > first_ ? elapsed / double(step - first_) * double(total_ - step) : -1;
  char head[96];
  std::snprintf(head, sizeof head, "%s %ld/%ld", label_.c_str(), long(step), long(total_));
  const std::string line = std::string(head) + " | " + fields + " | " + format_duration(elapsed) + " elapsed, ETA " +
                           format_duration(eta);
  if (tty_) {
    std::printf("\r\033[K%s", line.c_str());
    live_ = true;
  } else {
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

void Progress::note(const std::string& line) {
  if (tty_ && live_) std::printf("\r\033[K");
  std::printf("%s\n", line.c_str());
  live_ = false;
  std::fflush(stdout);
}

void Progress::finish() {
  if (tty_ && live_) std::printf("\n");
  live_ = false;
  std::fflush(stdout);
}

}  // namespace atl
