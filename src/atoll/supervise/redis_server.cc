// Starts and stops a private redis-server (see redis_server.h for the protocol and its races).
#include "atoll/supervise/redis_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>
#include <vector>

#include "atoll/core/errors.h"
#include "atoll/dist/store.h"

namespace atl {

namespace {

using Clock = std::chrono::steady_clock;

std::string seconds_text(std::chrono::milliseconds d) {
  std::ostringstream s;
  s << static_cast<double>(d.count()) / 1000.0 << " s";
  return s.str();
}

// A port nobody listens on right now: bind port 0 and read what the kernel chose.
int free_port(const std::string& host) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    throw ConfigError("redis-server host '" + host + "' is not an IPv4 address (use 127.0.0.1)");
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw IoError(std::string("socket: ") + std::strerror(errno));
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) throw IoError("cannot bind " + host + ":0 to find a free port: " + std::strerror(err));
  return ntohs(addr.sin_port);
}

// A log file that has no name: O_TMPFILE in the temporary folder, or (where the file system has
// no O_TMPFILE) a mkostemp file unlinked at once. Nothing is left in the folder however the
// launcher ends; the open descriptor keeps the file until the last process that holds it closes it.
int open_unnamed_log() {
  std::error_code ec;
  std::string dir = std::filesystem::temp_directory_path(ec).string();
  if (ec || dir.empty()) dir = "/tmp";
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  std::string path = dir + "/atoll-redis-XXXXXX";
  fd = ::mkostemp(path.data(), O_CLOEXEC);
  if (fd < 0) throw IoError("cannot create redis-server log in " + dir + ": " + std::strerror(errno) + "; fix: set TMPDIR to a writable folder");
  ::unlink(path.c_str());
  return fd;
}

}  // namespace

RedisServer::RedisServer(const RedisServerOptions& opts) : opts_(opts), owner_(::getpid()) {
  try {
    std::string failure;
    for (int attempt = 0; attempt < std::max(1, opts_.attempts); ++attempt) {
      if (try_start(opts_.port ? opts_.port : free_port(opts_.host), &failure)) return;
      if (opts_.port || failure.find("Address already in use") == std::string::npos) break;  // not the port race
    }
    throw Error("redis-server exited at start on " + opts_.host + ":" + std::to_string(port_) + ": " + failure);
  } catch (...) {
    stop();  // no destructor runs for a half-built object: remove the log, end the process
    throw;
  }
}

RedisServer::~RedisServer() {
  try {
    stop();
  } catch (...) {  // a destructor must not throw; stop() only fails on broken system calls
  }
}

std::string RedisServer::url() const { return "redis://" + opts_.host + ":" + std::to_string(port_); }

bool RedisServer::try_start(int port, std::string* failure) {
  port_ = port;
  if (log_fd_ >= 0) ::close(log_fd_);
  log_fd_ = open_unnamed_log();

  // The config file is "-", redis-server's stdin: a pipe that holds the password's line (a
  // pipe's buffer takes it whole, so it is written and closed before the server starts).
  int conf[2] = {-1, -1};
  if (!opts_.password.empty()) conf_pipe(conf);
  const std::string port_s = std::to_string(port);
  std::vector<std::string> argv = {opts_.binary};
  if (conf[0] >= 0) argv.push_back("-");
  for (const char* a : {"--port", port_s.c_str(), "--bind", opts_.host.c_str(), "--save", "", "--appendonly", "no",
                        "--protected-mode", "yes", "--daemonize", "no"})
    argv.push_back(a);
  std::vector<std::pair<int, int>> fds = {{log_fd_, 1}, {log_fd_, 2}};
  if (conf[0] >= 0) fds.push_back({conf[0], 0});
  try {
    process_ = Process::spawn({.argv = argv, .fds = fds, .death_signal = SIGTERM});
  } catch (const ExecFailed& e) {
    if (conf[0] >= 0) ::close(conf[0]);
    throw Error(std::string(e.what()) + "; fix: apt-get install redis-server (or pass --store redis://HOST:PORT)");
  } catch (...) {
    if (conf[0] >= 0) ::close(conf[0]);
    throw;
  }
  if (conf[0] >= 0) ::close(conf[0]);

  // Ready when it answers PING; give up early if it exits (port taken, bad option).
  const auto deadline = Clock::now() + opts_.start_timeout;
  for (;;) {
    if (process_.poll()) {
      *failure = log_tail();
      return false;
    }
    if (redis_ping(opts_.host, port_, std::chrono::milliseconds(200), nullptr, opts_.password)) return true;
    if (Clock::now() > deadline) {
      const std::string log = log_tail();  // before stop() removes the log
      stop();
      throw Timeout("redis-server on " + opts_.host + ":" + port_s + " did not answer PING within " +
                    seconds_text(opts_.start_timeout) + "; log: " + log);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // it is still starting up
  }
}

std::string RedisServer::restart_if_ended() {
  if (!process_.poll()) return "";
  const std::string how = process_.status().describe();
  std::string failure;
  if (!try_start(port_, &failure))
    throw Error("redis-server on " + opts_.host + ":" + std::to_string(port_) + " ended (" + how +
                ") and could not start again on its port: " + failure);
  return how;
}

void RedisServer::stop() {
  process_.terminate(opts_.stop_timeout);  // does nothing in a forked child: Process checks its owner
  if (::getpid() != owner_) return;
  if (log_fd_ >= 0) ::close(log_fd_), log_fd_ = -1;
}

void RedisServer::conf_pipe(int fds[2]) const {
  if (opts_.password.find_first_of(" \t\r\n\"'") != std::string::npos)
    throw ConfigError("redis-server password holds white space or quotes; fix: use letters and digits");
  if (::pipe2(fds, O_CLOEXEC) != 0) throw IoError(std::string("pipe: ") + std::strerror(errno));
  const std::string text = "requirepass " + opts_.password + "\n";
  const bool ok = ::write(fds[1], text.data(), text.size()) == ssize_t(text.size());
  const int err = errno;
  ::close(fds[1]);
  fds[1] = -1;
  if (!ok) {
    ::close(fds[0]);
    throw IoError(std::string("cannot hand redis-server its config: ") + std::strerror(err));
  }
}

std::string RedisServer::log_tail() const {
  std::string text;
  char buf[4096];
  for (off_t at = 0;;) {  // pread: the server's own writes keep their offset
    const ssize_t n = log_fd_ < 0 ? 0 : ::pread(log_fd_, buf, sizeof buf, at);
    if (n <= 0) break;
    text.append(buf, size_t(n));
    at += n;
  }
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  std::string out;
  for (size_t i = lines.size() > 3 ? lines.size() - 3 : 0; i < lines.size(); ++i)
    out += (out.empty() ? "" : " | ") + lines[i];
  return out.empty() ? "(empty log)" : out;
}

}  // namespace atl
