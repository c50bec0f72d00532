// A disk that fills up: a tmpfs of a few KiB, mounted in a forked child's own mount namespace so
// that nothing of it is seen outside the child (or left behind if the test dies). The child runs
// fn(mount point) and its result comes back as a string. Machines where the tests may not mount
// (not root, no CAP_SYS_ADMIN) give std::nullopt, and the caller skips.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace atl::testing {

inline std::optional<std::string> on_small_disk(size_t kib, const std::function<std::string(const std::string&)>& fn) {
  char tmpl[] = "/tmp/atoll-small-disk-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  const std::string dir = tmpl;
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::close(p[0]);
    std::string out;
    const std::string size = "size=" + std::to_string(kib) + "k";
    if (::unshare(CLONE_NEWNS) != 0 || ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", dir.c_str(), "tmpfs", 0, size.c_str()) != 0) {
      out = "\x01no mount";
    } else {
      try {
        out = "OK:" + fn(dir);
      } catch (const std::exception& e) {
        out = std::string("ERROR: ") + e.what();
      }
    }
    for (size_t done = 0; done < out.size();) {
      const ssize_t w = ::write(p[1], out.data() + done, out.size() - done);
      if (w <= 0) ::_exit(2);
      done += size_t(w);
    }
    ::_exit(0);
  }
  ::close(p[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) != 0;) {
    if (n < 0) break;
    out.append(buf, size_t(n));
  }
  ::close(p[0]);
  ::waitpid(pid, nullptr, 0);
  std::error_code ec;
  std::filesystem::remove(dir, ec);  // the mount went with the child's namespace: an empty folder
  if (out == "\x01no mount") return std::nullopt;
  return out.rfind("OK:", 0) == 0 ? out.substr(3) : out;
}

}  // namespace atl::testing
