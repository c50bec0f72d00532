// The watchdog's evidence (fault.step_timeout_s): a worker under `atoll launch` touches its
// progress file, RUN_DIR/progress/I.R, as each step begins. The launcher reads the file's age:
// a worker whose file has not been touched for longer than the timeout since it first was is
// hung in a step (its heartbeat thread may well go on) and is killed and restarted. A worker
// that has not begun a step since it started (loading, rejoining) is not judged.
#pragma once

#include <string>

#include "atoll/train/driver.h"

namespace atl {

std::string progress_path(const std::string& run_dir, int island, int rank);

class ProgressHook final : public StepHooks {
 public:
  // path: the file to touch ("" = none); the ATOLL_FAULT stall point runs here either way.
  explicit ProgressHook(const std::string& path);
  ~ProgressHook() override;
  ProgressHook(const ProgressHook&) = delete;
  ProgressHook& operator=(const ProgressHook&) = delete;
  void before_step(Loop& loop) override;

 private:
  int fd_ = -1;
};

}  // namespace atl
