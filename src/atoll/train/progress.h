// Progress of long work: on a terminal one line redrawn in place (step, loss, tokens/s, ETA);
// otherwise plain log lines at a bounded rate, so CI logs stay short.
#pragma once

#include <cstdint>
#include <string>

namespace atl {

class Progress {
 public:
  // `first_step`: the steps already done when this process started (a resumed run), so the
  // rate and the ETA count only the steps it takes.
  Progress(std::string label, int64_t total_steps, int64_t first_step = 0);
  // Call after each step; prints when due.
  void update(int64_t step, const std::string& fields);
  // A permanent line (validation results, checkpoints), keeping the live line intact.
  void note(const std::string& line);
  void finish();
  static std::string format_duration(double seconds);

 private:
  std::string label_;
  int64_t total_, first_;
  bool tty_;
  double start_, last_print_ = 0.0;
  bool live_ = false;
};

}  // namespace atl
