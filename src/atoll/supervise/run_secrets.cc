// A run's secrets (see run_secrets.h).
#include "atoll/supervise/run_secrets.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "atoll/core/errors.h"
#include "atoll/core/user_path.h"

namespace atl {

std::string random_secret() {
  unsigned char bytes[32];
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes))
    throw IoError("cannot read 32 bytes from /dev/urandom for a run secret");
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : bytes) s += kHex[b >> 4], s += kHex[b & 15];
  return s;
}

void write_secret_file(const std::string& path, const std::string& secret) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw IoError("cannot write " + path + ": " + std::strerror(errno));
  const std::string text = secret + "\n";
  // fchmod: a file that existed keeps its old mode through O_CREAT.
  const bool ok = ::fchmod(fd, 0600) == 0 && ::write(fd, text.data(), text.size()) == ssize_t(text.size());
  const int err = errno;
  ::close(fd);
  if (!ok) throw IoError("cannot write " + path + ": " + std::strerror(err));
}

std::string read_secret_file(const std::string& path, const std::string& flag) {
  check_input_file(path, flag, "give the file `atoll launch` wrote in the run directory");
  std::ifstream f(path);
  if (!f)
    throw ConfigError(flag + " " + path + ": cannot read it (" + std::strerror(errno) +
                      "); fix: give the file `atoll launch` wrote in the run directory");
  std::ostringstream s;
  s << f.rdbuf();
  std::string secret = s.str();
  while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back()))) secret.pop_back();
  if (secret.empty())
    throw ConfigError(flag + " " + path + ": the file is empty; fix: give the file `atoll launch` wrote in the run directory");
  return secret;
}

void write_run_id(const std::string& run_dir, const std::string& run_id) {
  const std::string path = run_dir + "/run.id";
  std::ofstream f(path, std::ios::trunc);
  if (!(f << run_id << "\n") || !f.flush()) throw IoError("cannot write " + path + ": " + std::strerror(errno));
}

std::optional<std::string> read_run_id(const std::string& run_dir) {
  const std::string path = run_dir + "/run.id";
  if (::access(path.c_str(), F_OK) != 0) return std::nullopt;
  return read_secret_file(path, "--run-dir " + run_dir + ":");
}

}  // namespace atl
