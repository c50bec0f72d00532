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
#include <fstream>
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
  char path[] = "/tmp/atoll-redis-XXXXXX";
  const int log_fd = ::mkostemp(path, O_CLOEXEC);
  if (log_fd < 0) throw IoError(std::string("cannot create redis-server log in /tmp: ") + std::strerror(errno));
  if (!log_path_.empty()) ::unlink(log_path_.c_str());
  log_path_ = path;

  const std::string port_s = std::to_string(port);
  std::vector<std::string> argv = {opts_.binary};
  if (!opts_.password.empty()) argv.push_back(write_password_conf());
  for (const char* a : {"--port", port_s.c_str(), "--bind", opts_.host.c_str(), "--save", "", "--appendonly", "no",
                        "--protected-mode", "yes", "--daemonize", "no"})
    argv.push_back(a);
  try {
    process_ = Process::spawn({.argv = argv,
                               .fds = {{log_fd, 1}, {log_fd, 2}},
                               .death_signal = SIGTERM});
  } catch (const ExecFailed& e) {
    ::close(log_fd);
    throw Error(std::string(e.what()) + "; fix: apt-get install redis-server (or pass --store redis://HOST:PORT)");
  } catch (...) {
    ::close(log_fd);
    throw;
  }
  ::close(log_fd);

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
  for (std::string* path : {&log_path_, &conf_path_})
    if (!path->empty()) ::unlink(path->c_str()), path->clear();
}

std::string RedisServer::write_password_conf() {
  if (!conf_path_.empty()) return conf_path_;
  if (opts_.password.find_first_of(" \t\r\n\"'") != std::string::npos)
    throw ConfigError("redis-server password holds white space or quotes; fix: use letters and digits");
  char path[] = "/tmp/atoll-redis-conf-XXXXXX";
  const int fd = ::mkostemp(path, O_CLOEXEC);  // mode 0600
  if (fd < 0) throw IoError(std::string("cannot create redis-server config in /tmp: ") + std::strerror(errno));
  conf_path_ = path;
  const std::string text = "requirepass " + opts_.password + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
  ::close(fd);
  if (!ok) throw IoError("cannot write redis-server config " + conf_path_ + ": " + std::strerror(errno));
  return conf_path_;
}

std::string RedisServer::log_tail() const {
  std::ifstream f(log_path_);
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) lines.push_back(line);
  std::string out;
  for (size_t i = lines.size() > 3 ? lines.size() - 3 : 0; i < lines.size(); ++i)
    out += (out.empty() ? "" : " | ") + lines[i];
  return out.empty() ? "(empty log)" : out;
}

}  // namespace atl
