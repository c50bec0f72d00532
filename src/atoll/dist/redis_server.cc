// Starts and stops a private redis-server (see redis_server.h for the protocol and its races).
#include "atoll/dist/redis_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "atoll/core/errors.h"

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

// Waits up to `timeout` for child `pid` to exit; true if it did (and was reaped). Uses a pidfd
// so the wait is an event, with a polling fallback for kernels without pidfd_open.
bool wait_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(timeout.count()));
    ::close(pidfd);
    return ::waitpid(pid, nullptr, WNOHANG) == pid;
  }
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return ::waitpid(pid, nullptr, WNOHANG) == pid;
}

}  // namespace

bool redis_ping(const std::string& host, int port, std::chrono::milliseconds timeout, std::string* error) {
  timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  redisContext* c = redisConnectWithTimeout(host.c_str(), port, tv);
  std::string why = "out of memory";
  bool ok = false;
  if (c != nullptr && c->err == 0) {
    redisSetTimeout(c, tv);
    auto* reply = static_cast<redisReply*>(redisCommand(c, "PING"));
    ok = reply != nullptr && reply->type == REDIS_REPLY_STATUS && std::string(reply->str, reply->len) == "PONG";
    why = reply == nullptr ? std::string(c->errstr) : "no PONG to PING: not a Redis server?";
    if (reply) freeReplyObject(reply);
  } else if (c != nullptr) {
    why = c->errstr;
  }
  if (c) redisFree(c);
  if (!ok && error) *error = why;
  return ok;
}

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
  std::vector<std::string> args = {opts_.binary, "--port",       port_s, "--bind",           opts_.host, "--save",
                                   "",           "--appendonly", "no",   "--protected-mode", "yes",      "--daemonize",
                                   "no"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  // exec failures come back through a close-on-exec pipe: EOF means exec succeeded.
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw IoError(std::string("pipe: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw IoError(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {  // child: only async-signal-safe calls until exec
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execvp(argv[0], argv.data());
    const int e = errno;
    [[maybe_unused]] ssize_t w = ::write(err_pipe[1], &e, sizeof(e));
    ::_exit(127);
  }
  ::close(err_pipe[1]);
  ::close(log_fd);
  int exec_errno = 0;
  ssize_t got;
  do got = ::read(err_pipe[0], &exec_errno, sizeof(exec_errno));
  while (got < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof(exec_errno))) {
    ::waitpid(pid, nullptr, 0);
    throw Error("cannot run '" + opts_.binary + "': " + std::strerror(exec_errno) +
                "; fix: apt-get install redis-server (or pass --store redis://HOST:PORT)");
  }
  pid_ = pid;

  // Ready when it answers PING; give up early if it exits (port taken, bad option).
  const auto deadline = Clock::now() + opts_.start_timeout;
  for (;;) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      *failure = log_tail();
      return false;
    }
    if (redis_ping(opts_.host, port_, std::chrono::milliseconds(200))) return true;
    if (Clock::now() > deadline) {
      stop();
      throw Timeout("redis-server on " + opts_.host + ":" + port_s + " did not answer PING within " +
                    seconds_text(opts_.start_timeout) + "; log: " + log_tail());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // it is still starting up
  }
}

void RedisServer::stop() {
  if (pid_ > 0 && ::getpid() == owner_) {
    ::kill(pid_, SIGTERM);
    if (!wait_exit(pid_, opts_.stop_timeout)) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
  }
  if (!log_path_.empty() && ::getpid() == owner_) {
    ::unlink(log_path_.c_str());
    log_path_.clear();
  }
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
