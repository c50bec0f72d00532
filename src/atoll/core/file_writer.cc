#include "atoll/core/file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "atoll/core/errors.h"

namespace atl {
namespace {

bool disk_full(int err) { return err == ENOSPC || err == EDQUOT; }

}  // namespace

std::string io_reason(int err) {
  const std::string system = std::strerror(err);
  return disk_full(err) ? "disk full (" + system + ")" : system;
}

void throw_io_error(const std::string& what, const std::string& path, int err) {
  const std::string fix = disk_full(err) ? "free space on that disk (df shows it), or write to another one"
                                         : "check the path, its permissions and free disk space";
  throw IoError("cannot " + what + " " + path + ": " + io_reason(err) + "; fix: " + fix);
}

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // write(2) may take less than asked (signals, a disk that just filled up): go on until it
    // fails, so the error reported is the reason it stopped.
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_io_error("write", path, errno);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

AppendFile::AppendFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_io_error("open for appending", path, errno);
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

AppendFile::AppendFile(AppendFile&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }

AppendFile& AppendFile::operator=(AppendFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void AppendFile::append(const void* data, size_t bytes) {
  if (fd_ >= 0) write_all(fd_, data, bytes, path_);
}

FileWriter::FileWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_io_error("create", path, errno);
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t bytes) {
  write_all(fd_, data, bytes, path_);
  written_ += bytes;
}

void FileWriter::sync() {
  if (::fsync(fd_) != 0) throw_io_error("fsync", path_, errno);
}

void FileWriter::close() {
  if (fd_ < 0) return;
  const int rc = ::close(fd_);
  fd_ = -1;
  // Network and some local file systems report a full disk only here.
  if (rc != 0) throw_io_error("close", path_, errno);
}

void write_file_atomic(const std::string& path, const std::string& bytes, bool sync) {
  const std::string tmp = path + ".tmp";
  try {
    FileWriter w(tmp);
    w.write(bytes.data(), bytes.size());
    if (sync) w.sync();
    w.close();
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw_io_error("rename " + tmp + " to", path, errno);
  } catch (const IoError&) {
    ::unlink(tmp.c_str());  // nothing half-written left behind
    throw;
  }
}

}  // namespace atl
