// The transport of the live view (status_model.h): an HTTP server (cpp-httplib, Debian's
// libcpp-httplib-dev) on its own threads, serving
//   GET /             the page (text/html)
//   GET /status.json  the snapshot as JSON
//   GET /metrics      the snapshot in Prometheus text format (text/plain; version=0.0.4)
//   GET /health       200 "ok" while the run goes on; 503 "failed: <why>" once it has failed
// and a refresh thread that calls `refresh` every `refresh_every` (the store's heartbeats: a
// store that is slow or away delays only this thread, never the launcher or a request).
//
// The address is bound in the constructor, before anything of the run starts: one that cannot
// be bound (taken by another process, a host that is not this machine's) is a ConfigError naming
// it, with the fix. The socket takes SO_REUSEADDR only (not httplib's default SO_REUSEPORT, with
// which a second launcher could share a port in use and get half the requests).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "atoll/supervise/status_model.h"

namespace atl {

struct StatusServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: a free port the system picks (port() tells which)
  std::chrono::milliseconds refresh_every{500};
  std::function<void()> refresh{};
};

class StatusServer {
 public:
  StatusServer(StatusModel& model, StatusServerOptions opts);
  ~StatusServer();  // stops serving and joins its threads
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  int port() const { return port_; }
  std::string url() const;  // "http://HOST:PORT/"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  StatusServerOptions opts_;
  int port_ = 0;
};

}  // namespace atl
