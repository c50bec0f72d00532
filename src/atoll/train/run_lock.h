// One writer per run directory: an exclusive flock(2) on RUN_DIR/.lock, taken by whoever writes
// the run (`atoll train`; `atoll launch` for all its workers; a worker 0 started by hand without
// a launcher) before anything in the folder is written, and held until the end.
//
// The file holds the holder's pid and host as one JSON line ({"pid": 1234, "host": "h"}), so a
// refused writer can name them. The kernel releases a flock when its holder dies, however it
// dies, so a lock file left by a killed process is free and is taken over (its pid is reported).
// The file is removed when the holder lets go: a lock file with no holder therefore means a
// process that ended without letting go. Taking the lock checks that the file locked is still
// the one at the path (a holder letting go may unlink it between our open and our flock).
#pragma once

#include <string>

namespace atl {

class RunLock {
 public:
  // Takes RUN_DIR/.lock, creating the folder (and its parents) when it does not exist. Throws
  // RunDirConflict naming the holder's pid and host when another process holds it.
  explicit RunLock(const std::string& run_dir);
  // Lets go: removes the lock file. Before commit(), a start that failed also removes what
  // taking the lock created (the folders), or puts back the content of a lock file it took over,
  // so the folder is as it was.
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  // The run has started writing its files: the folder stays when the lock is let go.
  void commit() { committed_ = true; }
  // "pid 1234 on host h" of the process whose lock file was taken over, "" when there was none.
  const std::string& stale_holder() const { return stale_holder_; }
  const std::string& path() const { return path_; }

 private:
  std::string run_dir_;
  std::string path_;              // RUN_DIR/.lock
  std::string created_root_;      // the outermost folder this lock created, "" if none
  std::string stale_holder_;
  std::string stale_content_;     // the lock file as it was, when taken over
  int fd_ = -1;
  bool committed_ = false;
};

// The name of the lock file inside a run directory.
inline constexpr const char* kRunLockFile = ".lock";

}  // namespace atl
