#include "atoll/dist/store_probe.h"

#include <hiredis/hiredis.h>

#include <cstdlib>
#include <memory>
#include <vector>

namespace atl {

namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;
using Context = std::unique_ptr<redisContext, void (*)(redisContext*)>;

constexpr int kClockSamples = 5;  // the shortest round trip of a few bounds the clock's error best

double wall_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

Reply command(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  return Reply(static_cast<redisReply*>(redisCommandArgv(c, int(argv.size()), argv.data(), lens.data())));
}

std::string text_of(const redisReply* r) { return r->str ? std::string(r->str, r->len) : std::string(); }

// TIME's answer: [seconds, microseconds] as two strings.
std::optional<double> seconds_of_time(const redisReply* r) {
  if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) return std::nullopt;
  for (size_t i = 0; i < 2; ++i)
    if (r->element[i]->type != REDIS_REPLY_STRING) return std::nullopt;
  return std::strtod(r->element[0]->str, nullptr) + std::strtod(r->element[1]->str, nullptr) * 1e-6;
}

}  // namespace

StoreProbe probe_store(const StoreAddress& store, std::chrono::milliseconds timeout) {
  StoreProbe p;
  const timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  const auto t0 = std::chrono::steady_clock::now();
  Context c(redisConnectWithTimeout(store.host.c_str(), store.port, tv), redisFree);
  if (c == nullptr || c->err != 0) {
    p.error = c == nullptr ? "out of memory" : c->errstr;
    return p;
  }
  p.reached = true;
  p.connect_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  redisSetTimeout(c.get(), tv);
  if (!store.password.empty()) {
    const Reply r = command(c.get(), {"AUTH", store.password});
    if (r == nullptr) {
      p.error = c->errstr;
      return p;
    }
    if (r->type == REDIS_REPLY_ERROR) {
      p.auth = StoreProbe::Auth::kRefused;
      p.error = text_of(r.get());
      return p;
    }
    p.auth = StoreProbe::Auth::kAccepted;
  }
  const Reply pong = command(c.get(), {"PING"});
  if (pong == nullptr) {
    p.error = c->errstr;
    return p;
  }
  const std::string said = text_of(pong.get());
  if (pong->type == REDIS_REPLY_ERROR && said.rfind("NOAUTH", 0) == 0) {
    p.auth = StoreProbe::Auth::kRequired;
    p.error = said;
    return p;
  }
  if (pong->type != REDIS_REPLY_STATUS || said != "PONG") {
    p.error = "no PONG to PING (" + (said.empty() ? std::string("no text") : said) + "): not a Redis server?";
    return p;
  }
  p.answers = true;
  double best_rtt = 0;
  for (int i = 0; i < kClockSamples; ++i) {
    const double before = wall_s();
    const Reply r = command(c.get(), {"TIME"});
    const double after = wall_s();
    if (r == nullptr) break;
    const std::optional<double> server = seconds_of_time(r.get());
    if (!server) break;
    if (!p.clock_offset_s || after - before < best_rtt) {
      best_rtt = after - before;
      p.clock_offset_s = *server - (before + after) / 2;
      p.clock_error_s = best_rtt / 2;
    }
  }
  return p;
}

}  // namespace atl
