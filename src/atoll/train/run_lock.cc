#include "atoll/train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "atoll/core/errors.h"

namespace atl {
namespace fs = std::filesystem;

namespace {

std::string read_all(int fd) {
  std::string text;
  char buf[512];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, size_t(n));
    at += n;
  }
  return text;
}

// Replaces the file's content; the lock file is small, one write does it.
void write_all(int fd, const std::string& text, const std::string& path) {
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != ssize_t(text.size()))
    throw IoError(path + ": cannot write the run lock (" + std::strerror(errno) + ")");
}

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

// "pid 1234 on host h" from the lock file's JSON line.
std::string describe_holder(const std::string& content) {
  const nlohmann::json j = nlohmann::json::parse(content, nullptr, false);
  if (!j.is_object() || !j.contains("pid")) return "a process that has not written its pid yet";
  return "pid " + j["pid"].dump() + " on host " + j.value("host", std::string("?"));
}

// The outermost folder of `dir` that does not exist yet ("" when `dir` exists).
std::string first_missing(const std::string& dir) {
  fs::path missing;
  for (fs::path p = fs::path(dir).lexically_normal(); !p.empty() && !fs::exists(p); p = p.parent_path()) {
    if (p.filename().empty()) continue;  // "runs/x/": the same folder as "runs/x"
    missing = p;
  }
  return missing.string();
}

}  // namespace

RunLock::RunLock(const std::string& run_dir) : run_dir_(run_dir), path_(run_dir + "/" + kRunLockFile) {
  created_root_ = first_missing(run_dir);
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec)
    throw IoError(run_dir + ": cannot create the run directory (" + ec.message() +
                  "); fix: choose a --run-dir where you may write");
  for (;;) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError(path_ + ": cannot open the run lock (" + std::strerror(errno) + ")");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string holder = describe_holder(read_all(fd_));
      ::close(fd_);
      fd_ = -1;
      if (err != EWOULDBLOCK) throw IoError(path_ + ": cannot lock (" + std::strerror(err) + ")");
      throw RunDirConflict(run_dir + " is in use by atoll " + holder + " (" + path_ +
                           "); fix: wait for that run to end or stop it, or choose another --run-dir");
    }
    // A holder letting go unlinks the file: the one we locked must still be the one at the path.
    struct stat held {}, now {};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev)
      break;
    ::close(fd_);
  }
  stale_content_ = read_all(fd_);
  if (!stale_content_.empty()) stale_holder_ = describe_holder(stale_content_);
  const nlohmann::json me = {{"pid", ::getpid()}, {"host", host_name()}};
  write_all(fd_, me.dump() + "\n", path_);
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  // Before commit() the folder is put back as it was; a taken-over lock file keeps its content.
  if (!committed_ && !stale_content_.empty()) {
    try {
      write_all(fd_, stale_content_, path_);
    } catch (const IoError&) {
    }
  } else {
    ::unlink(path_.c_str());
  }
  ::close(fd_);
  if (committed_ || created_root_.empty()) return;
  std::error_code ec;  // only empty folders go: a folder someone else filled meanwhile stays
  for (fs::path p = fs::path(run_dir_).lexically_normal();; p = p.parent_path()) {
    if (!p.filename().empty() && !fs::remove(p, ec)) break;
    if (p == fs::path(created_root_) || p.empty()) break;
  }
}

}  // namespace atl
