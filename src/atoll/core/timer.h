// Wall-clock timing helpers.
#pragma once

#include <chrono>

namespace atl {

inline double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// Adds the time of its scope to an accumulator (a phase of the step, say).
class ScopedTimer {
 public:
  explicit ScopedTimer(double* acc) : acc_(acc), start_(acc ? now_s() : 0.0) {}
  ~ScopedTimer() {
    if (acc_) *acc_ += now_s() - start_;
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double* acc_;
  double start_;
};

}  // namespace atl
