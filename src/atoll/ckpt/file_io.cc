#include "atoll/ckpt/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "atoll/core/errors.h"

namespace fs = std::filesystem;

namespace atl {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, const std::error_code& ec) {
  throw_io_error(what, path, ec.value());
}

}  // namespace

void write_text_file(const std::string& path, const std::string& text, bool sync) {
  FileWriter w(path);
  w.write(text.data(), text.size());
  if (sync) w.sync();
  w.close();
}

void write_text_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, text, /*sync=*/true);
  fsync_dir(fs::path(path).parent_path().string());
}

std::vector<std::byte> read_file_bytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_io_error("open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw_io_error("stat", path, err);
  }
  std::vector<std::byte> out(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;  // n == 0: the file shrank while we read it
      ::close(fd);
      throw_io_error("read", path, err);
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return out;
}

std::string read_text_file(const std::string& path) {
  std::vector<std::byte> b = read_file_bytes(path);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io_error("open directory", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory; the data itself was already synced.
  if (rc != 0 && err != EINVAL && err != ENOTSUP) throw_io_error("fsync directory", dir, err);
}

void make_dirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("create directory", dir, ec);
}

void remove_all(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) fail("remove", path, ec);
}

void publish_dir(const std::string& tmp, const std::string& final_dir) {
  std::error_code ec;
  std::string aside;
  if (fs::exists(final_dir, ec)) {
    aside = final_dir + ".old-" + std::to_string(::getpid());
    remove_all(aside);
    if (::rename(final_dir.c_str(), aside.c_str()) != 0) throw_io_error("move aside", final_dir, errno);
  }
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    int err = errno;
    if (!aside.empty()) ::rename(aside.c_str(), final_dir.c_str());  // put the old one back
    throw_io_error("rename " + tmp + " to", final_dir, err);
  }
  fsync_dir(fs::path(final_dir).parent_path().string());
  if (!aside.empty()) remove_all(aside);
}

}  // namespace atl
