// Writing files so that a failure says why: every failed system call on a file becomes an
// IoError naming the path and the system's reason, with the fix for that reason. A full disk
// (ENOSPC, or EDQUOT for a quota) reads "disk full" with the path, not a bare "cannot write"; a
// write that stops short is continued, so the error is the call that failed (errno is never
// read after a call that did not fail). Used by every part that writes: checkpoints and exports
// (ckpt/file_io.h adds fsync of folders and publishing by rename), token shards and the
// tokenizer (data/), metrics and events (train/metrics.h).
#pragma once

#include <cstddef>
#include <string>

namespace atl {

// The system's reason for `err` as users read it: "disk full (No space left on device)".
std::string io_reason(int err);

// Throws IoError "cannot <what> <path>: <reason>; fix: ..." for the errno value `err`.
[[noreturn]] void throw_io_error(const std::string& what, const std::string& path, int err);

// Writes all of data[bytes] to `fd` (whatever write(2) takes per call), else throw_io_error
// ("write", path, errno).
void write_all(int fd, const void* data, size_t bytes, const std::string& path);

// An open file written sequentially. close() (or the destructor, which swallows errors)
// releases it; sync() makes the bytes durable.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path);  // creates or truncates
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void sync();
  void close();
  size_t written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  size_t written_ = 0;
};

// A file opened for appending (created when missing), written a whole buffer per append(): one
// write(2) for a buffer the system takes at once, so lines or records appended by several
// processes never interleave (O_APPEND). Default-constructed, it writes nothing.
class AppendFile {
 public:
  AppendFile() = default;
  explicit AppendFile(const std::string& path);
  ~AppendFile();
  AppendFile(AppendFile&& o) noexcept;
  AppendFile& operator=(AppendFile&& o) noexcept;

  void append(const void* data, size_t bytes);
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Writes `bytes` to `path` through `path.tmp` and a rename (readers see the old content or the
// new), fsyncing the file when `sync`. On failure the temporary is removed and `path` is as it
// was.
void write_file_atomic(const std::string& path, const std::string& bytes, bool sync = false);

}  // namespace atl
