// A private redis-server on loopback, for tests and for `atoll launch` when no --store is given
// (Redis holds the rendezvous keys, heartbeats and membership epochs of a run; the client side,
// dist/store.h, only connects to it).
//
// Start: pick a free port (bind 127.0.0.1:0, read the port, close), run
//   redis-server --port P --bind HOST --save "" --appendonly no --protected-mode yes
// (spawned by process.h, like the workers: its own process group) with its log in a temporary
// file that has no name (O_TMPFILE, or unlinked at once: nothing is left in /tmp however the
// process ends), and wait until it answers PING (bounded by start_timeout). Another process can take the
// port between our probe and redis's bind; then redis exits with "Address already in use" and we
// try a fresh port (up to `attempts` times), which makes the race harmless. The child gets
// SIGTERM if the thread that started it exits (PR_SET_PDEATHSIG), so a crashed test leaves no
// server behind.
// Stop (destructor or stop()): SIGTERM, wait up to stop_timeout, then SIGKILL.
// Restart (restart_if_ended()): the same port and password, as its clients expect; redis-server
// binds with SO_REUSEADDR, so the port is free again as soon as the old process is gone.
//
// A fixed `port` is used as given: if it is taken, the error says so ("Address already in use").
//
// A password (`requirepass`) goes to redis-server as its config file "-", read from its stdin: a
// pipe, so the password is never in a file (none can be left behind by a killed launcher) nor on
// its command line, which `ps` shows to every user.
//
// Errors: redis-server missing -> Error with the fix ("apt-get install redis-server"); not
// answering in time -> Timeout; exiting at start -> Error with the tail of its log.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

#include "atoll/supervise/process.h"

namespace atl {

struct RedisServerOptions {
  std::string binary = "redis-server";  // looked up on PATH
  std::string host = "127.0.0.1";
  int port = 0;  // 0: pick a free port; a fixed port that is taken is an error
  std::chrono::milliseconds start_timeout{10000};
  std::chrono::milliseconds stop_timeout{5000};
  int attempts = 5;  // fresh ports tried when the chosen one is taken
  std::string password = {};  // requirepass; "" = none
};

class RedisServer {
 public:
  explicit RedisServer(const RedisServerOptions& opts = {});
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  const std::string& host() const { return opts_.host; }
  int port() const { return port_; }
  std::string url() const;  // "redis://127.0.0.1:PORT", what --store takes (without the password)
  const std::string& password() const { return opts_.password; }
  pid_t pid() const { return process_.running() ? process_.pid() : -1; }

  // Stops the server (idempotent). Does nothing in a process forked from the one that started it.
  void stop();

  // Supervision (`atoll launch`): when the server's process has ended (killed, crashed), starts
  // it again on the same port with the same password and returns how it had ended ("signal 9");
  // returns "" while it runs. The store comes back empty: its clients reconnect and write back
  // what they keep (dist/store.h "Restarts"). Throws as the constructor does when it cannot start.
  std::string restart_if_ended();

 private:
  bool try_start(int port, std::string* failure);
  std::string log_tail() const;
  void conf_pipe(int fds[2]) const;  // a pipe holding the password's config line, its write end closed

  RedisServerOptions opts_;
  int port_ = 0;
  Process process_;
  pid_t owner_ = -1;  // the process that started the server; forked children never stop it
  int log_fd_ = -1;  // the server's log (stdout and stderr), a file without a name
};

}  // namespace atl
