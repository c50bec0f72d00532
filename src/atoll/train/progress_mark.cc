#include "atoll/train/progress_mark.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "atoll/core/errors.h"
#include "atoll/core/fault_injection.h"
#include "atoll/core/worker_phase.h"

namespace atl {

std::string progress_path(const std::string& run_dir, int island, int rank) {
  return run_dir + "/progress/" + std::to_string(island) + "." + std::to_string(rank);
}

ProgressHook::ProgressHook(const std::string& path) {
  if (path.empty()) return;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  fd_ = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError(path + ": " + std::strerror(errno) + "; fix: make the run directory writable");
}

ProgressHook::~ProgressHook() {
  if (fd_ >= 0) ::close(fd_);
}

void ProgressHook::before_step(Loop& loop) {
  if (fd_ >= 0) ::futimens(fd_, nullptr);  // now: this step begins
  enter_phase(WorkerPhase::kTraining);
  fault_step(loop.step + 1);
}

}  // namespace atl
