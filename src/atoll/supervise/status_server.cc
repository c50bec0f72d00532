#include "atoll/supervise/status_server.h"

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <httplib.h>
#include <mutex>
#include <thread>

#include "atoll/core/errors.h"

namespace atl {

struct StatusServer::Impl {
  httplib::Server http;
  std::thread serve, refresh;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::atomic<bool> serve_ended{false};
};

StatusServer::StatusServer(StatusModel& model, StatusServerOptions opts)
    : impl_(std::make_unique<Impl>()), opts_(std::move(opts)) {
  httplib::Server& http = impl_->http;
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // A few threads are plenty for a page that a person or a scraper polls.
  http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  http.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(status_page(), "text/html; charset=utf-8"); });
  http.Get("/status.json", [&model](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_content(status_json(model.snapshot()), "application/json");
  });
  http.Get("/metrics", [&model](const httplib::Request&, httplib::Response& res) {
    res.set_content(status_prometheus(model.snapshot()), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/health", [&model](const httplib::Request&, httplib::Response& res) {
    const RunStatus s = model.snapshot();
    if (s.state == "failed") {
      res.status = 503;
      res.set_content("failed: " + s.why + "\n", "text/plain");
    } else {
      res.set_content("ok\n", "text/plain");
    }
  });
  errno = 0;
  const bool bound = opts_.port == 0 ? (port_ = http.bind_to_any_port(opts_.host)) > 0
                                     : (port_ = opts_.port, http.bind_to_port(opts_.host, opts_.port));
  if (!bound) {
    const int err = errno;
    throw ConfigError("--status-host " + opts_.host + " --status-port " + std::to_string(opts_.port) +
                      ": cannot listen there (" + (err ? std::strerror(err) : "no such local address") +
                      "); fix: another --status-port (0 picks a free one), or leave it out for no live view");
  }
  impl_->serve = std::thread([this] {
    impl_->http.listen_after_bind();
    impl_->serve_ended = true;
  });
  if (opts_.refresh)
    impl_->refresh = std::thread([this] {
      std::unique_lock<std::mutex> lock(impl_->mu);
      do {
        lock.unlock();
        opts_.refresh();
        lock.lock();
      } while (!impl_->cv.wait_for(lock, opts_.refresh_every, [this] { return impl_->stop; }));
    });
}

StatusServer::~StatusServer() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  // httplib's stop() does nothing before the serving loop has begun: wait for it to begin.
  while (!impl_->http.is_running() && !impl_->serve_ended) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->http.stop();
  if (impl_->serve.joinable()) impl_->serve.join();
  if (impl_->refresh.joinable()) impl_->refresh.join();
}

std::string StatusServer::url() const {
  const bool v6 = opts_.host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + opts_.host + "]" : opts_.host) + ":" + std::to_string(port_) + "/";
}

}  // namespace atl
