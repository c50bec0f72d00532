// Rendezvous store over Redis (see store.h): Gloo's RedisStore with bounded waits, socket
// timeouts and a lock, behind Gloo PrefixStores.
#include "atoll/dist/store.h"

#include <gloo/common/error.h>
#include <hiredis/hiredis.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/redis_store.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>

#include "atoll/core/errors.h"
#include "atoll/dist/seal.h"

namespace atl {

namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

std::string seconds_text(Ms d) {
  std::ostringstream s;
  s << static_cast<double>(d.count()) / 1000.0 << " s";
  return s.str();
}

timeval to_timeval(Ms d) {
  return timeval{static_cast<time_t>(d.count() / 1000), static_cast<suseconds_t>(d.count() % 1000 * 1000)};
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

std::string join(const std::vector<std::string>& keys) {
  std::string s;
  for (auto& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

// A store that refuses our password, or wants one we did not give: waiting would not help.
[[noreturn]] void refuse_password(const std::string& url, bool given, const std::string& reply) {
  throw ConfigError(url + (given ? ": store refused the password (" : ": store requires a password (") + reply +
                    "); fix: give the store's password as redis://:PASSWORD@HOST:PORT (the store that `atoll launch` "
                    "starts: RUN_DIR/store.password)");
}

// AUTH on a fresh connection; a refusal throws ConfigError. Returns false when the connection
// itself failed (the caller reports it as unreachable).
bool authenticate(redisContext* c, const std::string& url, const std::string& password) {
  if (password.empty()) return true;
  auto* reply = static_cast<redisReply*>(redisCommand(c, "AUTH %b", password.data(), password.size()));
  if (reply == nullptr) return false;
  Reply r(reply);
  if (r->type == REDIS_REPLY_ERROR) refuse_password(url, true, std::string(r->str, r->len));
  return true;
}

}  // namespace

// What a process keeps in the store across a server restart: slot -> (key, value).
struct KeptKeys {
  std::mutex mu;
  std::map<std::string, std::pair<std::string, std::string>> slots;
};

// Gloo's RedisStore, made bounded and thread-safe. Gloo calls set/get/wait on it through a
// PrefixStore; Store calls command() directly.
class BoundedRedisStore final : public gloo::rendezvous::RedisStore {
 public:
  BoundedRedisStore(const StoreAddress& addr, Ms timeout)
      : gloo::rendezvous::RedisStore(addr.host, addr.port), url_(addr.url()), password_(addr.password), timeout_(timeout) {
    redisSetTimeout(redis_, to_timeval(timeout));  // no command blocks longer than a wait may
    if (!authenticate(redis_, url_, addr.password))
      throw IoError(url_ + ": store connection lost during AUTH: " + redis_->errstr);
  }

  void set(const std::string& key, const std::vector<char>& data) override {
    const std::string value(data.begin(), data.end());
    Reply r = command({"SETNX", key, value});
    // A rendezvous key outlives a restart of the server: peers may still wait for it.
    keep("gloo/" + std::to_string(gloo_keys_++ % kKeptGlooKeys), key, value);
    if (r->integer != 1 && !holds(key, value))  // equal: our own write, sent again after a lost connection
      throw ConfigError(url_ + ": store key '" + key + "' is already set: another process joined with the same " +
                        "rank, or the run id is reused (fix: one rank per process, a fresh run id per run)");
  }

  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    Reply r = command({"GET", key});
    if (r->type != REDIS_REPLY_STRING) throw IoError(url_ + ": store key '" + key + "' vanished");
    return std::vector<char>(r->str, r->str + r->len);
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  // Polls EXISTS (Gloo polls too) from 1 ms up to 10 ms apart until `timeout`, capped by the
  // store's own timeout; then Timeout naming the keys still missing.
  void wait(const std::vector<std::string>& keys, const Ms& timeout) override {
    const Ms limit = timeout.count() > 0 ? std::min(timeout, timeout_) : timeout_;
    const auto deadline = Clock::now() + limit;
    Ms pause(1);
    for (;;) {
      std::vector<std::string> missing;
      for (auto& k : keys)
        if (!exists(k)) missing.push_back(k);
      if (missing.empty()) return;
      if (Clock::now() >= deadline)
        throw Timeout(url_ + ": waited " + seconds_text(limit) + " for store key(s) " + join(missing));
      std::this_thread::sleep_for(std::min(pause, std::chrono::duration_cast<Ms>(deadline - Clock::now())));
      pause = std::min(pause * 2, Ms(10));
    }
  }

  bool exists(const std::string& key) { return command({"EXISTS", key})->integer == 1; }

  // One Redis command; throws Timeout (socket timeout), IoError (a Redis error, or the connection
  // lost and not back within the timeout) or ConfigError (the password refused on reconnecting).
  Reply command(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    std::lock_guard<std::mutex> lock(mu_);
    std::optional<Clock::time_point> lost_since;
    std::string lost_why;
    Ms pause(10);
    for (;;) {
      if (!broken_) {
        auto* raw = static_cast<redisReply*>(
            redisCommandArgv(redis_, static_cast<int>(argv.size()), argv.data(), lens.data()));
        if (raw != nullptr) {
          Reply r(raw);
          if (r->type == REDIS_REPLY_ERROR)
            throw IoError(url_ + ": store " + args[0] + " error: " + std::string(r->str, r->len));
          return r;
        }
        const bool timed_out = redis_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
        // Either way the connection is done with: hiredis refuses every later command on a
        // context with an error, and a late answer would be read as the next command's. The next
        // command connects again (a link cut for longer than the timeout, then restored).
        broken_ = true;
        if (timed_out)
          throw Timeout(url_ + ": store " + args[0] + " failed: " + redis_->errstr + " (no answer within " +
                        seconds_text(timeout_) + ")");
        lost_why = redis_->errstr;
      }
      if (!lost_since) lost_since = Clock::now();
      if (Clock::now() - *lost_since >= timeout_)
        throw StoreLost(url_ + ": store " + args[0] + " failed: connection lost (" + lost_why + ") and not back within " +
                      seconds_text(timeout_) + "; fix: check the redis-server given to --store");
      std::this_thread::sleep_for(pause);  // the server may be restarting
      pause = std::min(pause * 2, Ms(200));
      reconnect(&lost_why);
    }
  }

  // Kept keys live in `kept` (shared with other connections of this process).
  void set_kept(std::shared_ptr<KeptKeys> kept) {
    std::lock_guard<std::mutex> lock(mu_);
    kept_ = std::move(kept);
  }
  std::shared_ptr<KeptKeys> kept() {
    std::lock_guard<std::mutex> lock(mu_);
    return kept_;
  }
  void keep(const std::string& slot, const std::string& key, const std::string& value) {
    const std::shared_ptr<KeptKeys> k = kept();
    std::lock_guard<std::mutex> lock(k->mu);
    k->slots[slot] = {key, value};
  }
  void forget(const std::string& slot) {
    const std::shared_ptr<KeptKeys> k = kept();
    std::lock_guard<std::mutex> lock(k->mu);
    k->slots.erase(slot);
  }
  uint64_t reconnections() const { return reconnections_.load(); }

 private:
  static constexpr uint64_t kKeptGlooKeys = 64;  // rendezvous keys of the newest groups

  bool holds(const std::string& key, const std::string& value) {
    Reply r = command({"GET", key});
    return r->type == REDIS_REPLY_STRING && std::string(r->str, r->len) == value;
  }

  // One attempt (mu_ held): a new connection, AUTH (a refusal throws ConfigError), then the
  // kept keys written back. On failure *why says why and the connection stays broken.
  void reconnect(std::string* why) {
    if (redisReconnect(redis_) != REDIS_OK) {
      *why = redis_->errstr;
      return;
    }
    redisSetTimeout(redis_, to_timeval(timeout_));
    if (!authenticate(redis_, url_, password_)) {
      *why = redis_->errstr;
      return;
    }
    std::vector<std::pair<std::string, std::string>> kept;
    {
      std::lock_guard<std::mutex> lock(kept_->mu);
      for (const auto& [slot, kv] : kept_->slots) kept.push_back(kv);
    }
    for (const auto& [key, value] : kept) {
      auto* raw = static_cast<redisReply*>(redisCommand(redis_, "SETNX %b %b", key.data(), key.size(), value.data(),
                                                        value.size()));
      if (raw == nullptr) {
        *why = redis_->errstr;
        return;
      }
      freeReplyObject(raw);
    }
    broken_ = false;
    ++reconnections_;
  }

  std::string url_;
  std::string password_;
  Ms timeout_;
  std::mutex mu_;
  bool broken_ = false;  // the connection was lost; reconnect before the next command
  std::atomic<uint64_t> reconnections_{0};
  uint64_t gloo_keys_ = 0;
  std::shared_ptr<KeptKeys> kept_ = std::make_shared<KeptKeys>();
};

std::string StoreAddress::url() const {
  const bool v6 = host.find(':') != std::string::npos;
  return "redis://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

StoreAddress parse_store_url(const std::string& url) {
  std::string rest = url;
  const std::string scheme = "redis://";
  if (rest.rfind(scheme, 0) == 0) rest = rest.substr(scheme.size());
  StoreAddress a;
  // Userinfo: ":PASSWORD" or "default:PASSWORD" (Redis's default user); the password may hold
  // any character but '@' is taken as the last one's end, so it may hold '@' too.
  if (const size_t at = rest.rfind('@'); at != std::string::npos) {
    const std::string user_info = rest.substr(0, at);
    const size_t colon = user_info.find(':');
    const std::string user = user_info.substr(0, colon);
    if (colon == std::string::npos || (!user.empty() && user != "default") || colon + 1 == user_info.size())
      throw ConfigError("store '" + redact_store_url(url) +
                        "': the part before '@' is not ':PASSWORD'; fix: write redis://:PASSWORD@HOST:PORT");
    a.password = user_info.substr(colon + 1);
    rest = rest.substr(at + 1);
  }
  if (rest.find("://") != std::string::npos || rest.empty() || rest.find('/') != std::string::npos)
    throw ConfigError("store '" + redact_store_url(url) + "' is not redis://HOST:PORT");
  // An IPv6 host is written in brackets (RFC 3986): [::1]:6379; a bare one is ambiguous.
  size_t colon = rest.rfind(':');
  if (rest[0] == '[') {
    const size_t close = rest.find(']');
    if (close == std::string::npos)
      throw ConfigError("store '" + redact_store_url(url) + "': '[' of an IPv6 host is not closed; fix: write redis://[ADDRESS]:PORT");
    if (close + 1 < rest.size() && rest[close + 1] != ':')
      throw ConfigError("store '" + redact_store_url(url) + "': text after the IPv6 host's ']' is not ':PORT'; fix: write redis://[ADDRESS]:PORT");
    a.host = rest.substr(1, close - 1);
    colon = close + 1 < rest.size() ? close + 1 : std::string::npos;
  } else {
    if (colon != std::string::npos && rest.find(':') != colon)
      throw ConfigError("store '" + redact_store_url(url) + "': an IPv6 host needs brackets; fix: write redis://[ADDRESS]:PORT");
    a.host = rest.substr(0, colon);
  }
  if (colon != std::string::npos) {
    const std::string port = rest.substr(colon + 1);
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || p <= 0 || p > 65535)
      throw ConfigError("store '" + redact_store_url(url) + "': port '" + port + "' is not a number in 1..65535");
    a.port = static_cast<int>(p);
  }
  if (a.host.empty()) throw ConfigError("store '" + redact_store_url(url) + "' has no host");
  return a;
}

std::string redact_store_url(const std::string& url) {
  const size_t at = url.rfind('@');
  if (at == std::string::npos) return url;
  const size_t from = url.rfind("://", at) == std::string::npos ? 0 : url.rfind("://", at) + 3;
  return url.substr(0, from) + ":***@" + url.substr(at + 1);
}

bool redis_ping(const std::string& host, int port, Ms timeout, std::string* error, const std::string& password) {
  const timeval tv = to_timeval(timeout);
  const std::string url = StoreAddress{.host = host, .port = port, .password = ""}.url();
  std::unique_ptr<redisContext, void (*)(redisContext*)> c(redisConnectWithTimeout(host.c_str(), port, tv), redisFree);
  std::string why = "out of memory";
  bool ok = false;
  if (c != nullptr && c->err == 0) {
    redisSetTimeout(c.get(), tv);
    if (authenticate(c.get(), url, password)) {  // throws ConfigError when refused
      Reply reply(static_cast<redisReply*>(redisCommand(c.get(), "PING")));
      const std::string text = reply ? std::string(reply->str ? reply->str : "", reply->len) : "";
      if (reply && reply->type == REDIS_REPLY_ERROR && text.rfind("NOAUTH", 0) == 0) refuse_password(url, false, text);
      ok = reply != nullptr && reply->type == REDIS_REPLY_STATUS && text == "PONG";
      why = reply == nullptr ? std::string(c->errstr) : "no PONG to PING: not a Redis server?";
    } else {
      why = c->errstr;
    }
  } else if (c != nullptr) {
    why = c->errstr;
  }
  if (!ok && error) *error = why;
  return ok;
}

Store::Store(const StoreOptions& opts) : opts_(opts), addr_(parse_store_url(opts.url)) {
  if (!opts_.password.empty()) addr_.password = opts_.password;
  // Probe with PING until the deadline: a store that is still starting is not an error (a
  // refused password is, at once: redis_ping throws).
  const auto deadline = Clock::now() + opts_.timeout;
  Ms pause(10);
  std::string why;
  for (;;) {
    const auto left = std::chrono::duration_cast<Ms>(deadline - Clock::now());
    if (redis_ping(addr_.host, addr_.port, std::clamp(left, Ms(1), Ms(1000)), &why, addr_.password)) break;
    if (Clock::now() >= deadline)
      throw Timeout(addr_.url() + ": store unreachable after " + seconds_text(opts_.timeout) + " (" + why +
                    "); fix: start redis-server or pass --store");
    std::this_thread::sleep_for(std::min(pause, std::chrono::duration_cast<Ms>(deadline - Clock::now())));
    pause = std::min(pause * 2, Ms(200));
  }
  try {
    redis_ = std::make_unique<BoundedRedisStore>(addr_, opts_.timeout);
  } catch (const gloo::Exception& e) {
    throw Timeout(addr_.url() + ": store unreachable: " + e.what() + "; fix: start redis-server or pass --store");
  }
}

Store::~Store() = default;

std::string Store::run_prefix() const { return "atoll/" + opts_.run_id; }

std::string Store::group_prefix(const std::string& group, uint64_t epoch) const {
  return run_prefix() + "/" + group + "/e" + std::to_string(epoch);
}

std::unique_ptr<gloo::rendezvous::Store> Store::gloo_view(const std::string& prefix) {
  return std::make_unique<gloo::rendezvous::PrefixStore>(prefix, *redis_);
}

bool Store::authenticated(const std::string& key) const {
  if (!opts_.records) return false;
  const std::string run = run_prefix();
  if (key.size() <= run.size() || key.compare(0, run.size(), run) != 0) return false;
  const std::string_view rest = std::string_view(key).substr(run.size());
  return (rest.starts_with("/members/") && rest != "/members/run_token") || rest.starts_with("/ckpt/");
}

std::string Store::sign(const std::string& key, const std::string& value) const {
  return authenticated(key) ? opts_.records->sign_record(key, value) : value;
}

std::optional<std::string> Store::open(const std::string& key, std::optional<std::string> stored) const {
  if (!stored || !authenticated(key)) return stored;
  return opts_.records->open_record(key, *stored);
}

std::optional<std::string> Store::get_raw(const std::string& key) {
  Reply r = redis_->command({"GET", key});
  if (r->type != REDIS_REPLY_STRING) return std::nullopt;
  return std::string(r->str, r->len);
}

// The same script as erase_if_equal's, on the stored bytes themselves (no MAC added).
constexpr const char* kEraseIfEqual =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

bool Store::clear_forged(const std::string& key) {
  if (!authenticated(key)) return false;
  const std::optional<std::string> raw = get_raw(key);
  return raw && !open(key, raw) && redis_->command({"EVAL", kEraseIfEqual, "1", key, *raw})->integer == 1;
}

bool Store::set_if_absent(const std::string& key, const std::string& value) {
  const std::string v = sign(key, value);
  if (redis_->command({"SETNX", key, v})->integer == 1) return true;
  return clear_forged(key) && redis_->command({"SETNX", key, v})->integer == 1;
}

void Store::set(const std::string& key, const std::string& value) { redis_->command({"SET", key, sign(key, value)}); }

std::optional<std::string> Store::get(const std::string& key) { return open(key, get_raw(key)); }

std::vector<bool> Store::exists(const std::vector<std::string>& keys) {
  std::vector<bool> out;
  for (auto& k : keys) out.push_back(redis_->exists(k));
  return out;
}

int64_t Store::increment(const std::string& key, int64_t by) {
  return redis_->command({"INCRBY", key, std::to_string(by)})->integer;
}

void Store::set_with_ttl(const std::string& key, const std::string& value, Ms ttl) {
  redis_->command({"SET", key, sign(key, value), "PX", std::to_string(std::max<int64_t>(1, ttl.count()))});
}

std::vector<std::optional<std::string>> Store::get_many(const std::vector<std::string>& keys) {
  std::vector<std::optional<std::string>> out;
  if (keys.empty()) return out;
  std::vector<std::string> args{"MGET"};
  args.insert(args.end(), keys.begin(), keys.end());
  Reply r = redis_->command(args);
  if (r->type != REDIS_REPLY_ARRAY || r->elements != keys.size())
    throw IoError(url() + ": store MGET of " + std::to_string(keys.size()) + " keys: unexpected reply");
  for (size_t i = 0; i < r->elements; ++i) {
    const redisReply* e = r->element[i];
    if (e->type == REDIS_REPLY_STRING) out.emplace_back(open(keys[i], std::string(e->str, e->len)));
    else out.emplace_back(std::nullopt);
  }
  return out;
}

void Store::erase(const std::string& key) { redis_->command({"DEL", key}); }

bool Store::erase_if_equal(const std::string& key, const std::string& value) {
  return redis_->command({"EVAL", kEraseIfEqual, "1", key, sign(key, value)})->integer == 1;
}

bool Store::set_with_ttl_if_free(const std::string& key, const std::string& value, Ms ttl) {
  static const std::string kScript =
      "local v = redis.call('GET', KEYS[1]) "
      "if v == false or v == ARGV[1] then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end "
      "return 0";
  const std::string v = sign(key, value), px = std::to_string(std::max<int64_t>(1, ttl.count()));
  if (redis_->command({"EVAL", kScript, "1", key, v, px})->integer == 1) return true;
  return clear_forged(key) && redis_->command({"EVAL", kScript, "1", key, v, px})->integer == 1;
}

std::optional<Store::Expiring> Store::get_expiring(const std::string& key) {
  // One script, so that the value and the expiry are of the same write.
  static const std::string kScript = "return {redis.call('GET', KEYS[1]), redis.call('PEXPIRETIME', KEYS[1])}";
  Reply r = redis_->command({"EVAL", kScript, "1", key});
  // A missing key's GET is Lua's false, which ends the array: one element or none.
  if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 || r->element[0]->type != REDIS_REPLY_STRING) return std::nullopt;
  std::optional<std::string> value = open(key, std::string(r->element[0]->str, r->element[0]->len));
  if (!value) return std::nullopt;
  return Expiring{.value = std::move(*value), .expires_at_ms = r->element[1]->integer};
}

std::vector<std::string> Store::scan(const std::string& pattern) {
  std::vector<std::string> keys;
  std::string cursor = "0";
  do {
    Reply r = redis_->command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING)
      throw IoError(url() + ": store SCAN: unexpected reply");
    cursor.assign(r->element[0]->str, r->element[0]->len);
    const redisReply* batch = r->element[1];
    for (size_t i = 0; i < batch->elements; ++i) keys.emplace_back(batch->element[i]->str, batch->element[i]->len);
  } while (cursor != "0");
  std::sort(keys.begin(), keys.end());  // SCAN may return a key twice
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

void Store::wait(const std::vector<std::string>& keys, Ms timeout) { redis_->wait(keys, timeout); }

void Store::keep(const std::string& slot, const std::string& key, const std::string& value) {
  redis_->keep(slot, key, sign(key, value));
}

void Store::forget(const std::string& slot) { redis_->forget(slot); }

void Store::share_kept_keys_with(Store& other) { other.redis_->set_kept(redis_->kept()); }

uint64_t Store::reconnections() const { return redis_->reconnections(); }

}  // namespace atl
