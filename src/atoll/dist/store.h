// The rendezvous store: one connection to Redis through Gloo's RedisStore, seen through Gloo
// PrefixStores so that every key of a run lives under "atoll/<run_id>/..." and every key of a
// process group under "atoll/<run_id>/<group>/e<epoch>/..." (the membership epoch is part of
// every prefix, so a group re-formed after a failure never meets the keys of the old one).
//
// Why a subclass of Gloo's RedisStore rather than the class itself: its waits are bounded by a
// hard-coded 30 s (get) and its clock counts whole seconds; here every wait is bounded by
// StoreOptions::timeout (to the millisecond) and ends in atl::Timeout naming the missing keys,
// every Redis command has a socket timeout, and one mutex makes the connection usable from
// several threads. Keys are written with SETNX, as Gloo does: a key is written once, so a
// second process claiming the same rank is caught, and a run id must be unique per run.
//
// Errors: unreachable at construction -> Timeout ("redis://127.0.0.1:6399: store unreachable
// after 5 s (Connection refused); fix: start redis-server or pass --store"); a wait that runs out
// -> Timeout naming the keys; the connection lost later -> StoreLost (an IoError).
//
// Passwords (Redis `requirepass`): given as redis://:PASSWORD@HOST:PORT or in
// StoreOptions::password; every connection sends AUTH first. A password the store refuses, or
// none where the store wants one, is a ConfigError at once (waiting would not fix it). Messages
// and url() never show the password.
//
// Restarts (a redis-server that dies and comes back on the same address, empty): a command
// whose connection is lost (EOF, reset, refused) reconnects with backoff (10 ms doubling to
// 200 ms) and is sent again, until StoreOptions::timeout has passed since the loss; then StoreLost.
// Only a lost connection is retried: a refused password on reconnecting is still a ConfigError at
// once, a Redis error reply an IoError at once, a command with no answer within the timeout a
// Timeout, after which the connection is made again for the next command (a late answer must
// not be read as another command's). What the run needs from the store must be written again after a restart: each process
// keeps its own such keys (keep()), and every reconnection writes them back with SETNX (what a
// peer wrote meanwhile stands). reconnections() counts them, so that callers who judge liveness
// from the store can let the peers' heartbeats come back first (membership.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "atoll/core/errors.h"

namespace gloo::rendezvous {
class Store;
}

namespace atl {

class Sealer;  // seal.h

// The store's connection was lost and did not come back within the store's timeout (a cut
// link, a dead server). A worker without a launcher then waits to rejoin (train/self_rejoin.h).
class StoreLost : public IoError {
 public:
  using IoError::IoError;
};

struct StoreAddress {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string password;     // "" = none
  std::string url() const;  // "redis://HOST:PORT" (never the password)
};

// "redis://HOST:PORT", "HOST:PORT" or "HOST" (port 6379), each optionally with ":PASSWORD@"
// (or "default:PASSWORD@") before the host; anything else throws ConfigError.
StoreAddress parse_store_url(const std::string& url);
// The URL with any password replaced by "***", for messages.
std::string redact_store_url(const std::string& url);

// True when a Redis server at host:port answers PING within `timeout`; else false, with the
// reason ("Connection refused") in *error when given. With a password it sends AUTH first. A
// server that refuses the password, or wants one that was not given, throws ConfigError.
bool redis_ping(const std::string& host, int port, std::chrono::milliseconds timeout, std::string* error = nullptr,
                const std::string& password = "");

struct StoreOptions {
  std::string url = "redis://127.0.0.1:6379";
  std::string password = {};                 // overrides the URL's; "" = the URL's (or none)
  std::string run_id = "run";                // first part of every key; unique per run
  std::chrono::milliseconds timeout{30000};  // connecting, and every wait for a key
  // Authenticated records (seal.h): with the run's sealer, every value under
  // "atoll/<run_id>/members/" (but members/run_token, the door's verifier) and "atoll/<run_id>/ckpt/"
  // is written with a MAC of the run's key, and read back only with a valid one: a record
  // written without the key (another process on the store, or an attacker with its password) is
  // reported and read as absent, and one in the way of a write-once or a claim (set_if_absent,
  // set_with_ttl_if_free) is deleted first. Null: values as they are.
  std::shared_ptr<const Sealer> records{};
};

class BoundedRedisStore;  // store.cc
struct KeptKeys;          // store.cc

class Store {
 public:
  // Connects, retrying until options.timeout (the store may still be starting).
  explicit Store(const StoreOptions& opts);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const StoreOptions& options() const { return opts_; }
  const StoreAddress& address() const { return addr_; }
  std::string url() const { return addr_.url(); }
  std::chrono::milliseconds timeout() const { return opts_.timeout; }

  // "atoll/<run_id>": the prefix of every key of this run.
  std::string run_prefix() const;
  // "atoll/<run_id>/<group>/e<epoch>": the prefix of one process group at one epoch.
  std::string group_prefix(const std::string& group, uint64_t epoch) const;

  // A Gloo store whose keys go under `prefix + "/"` (a gloo::rendezvous::PrefixStore over this
  // connection), for gloo::rendezvous::Context::connectFullMesh. Valid while *this lives.
  std::unique_ptr<gloo::rendezvous::Store> gloo_view(const std::string& prefix);

  // Direct operations on absolute keys, for membership and heartbeats.
  bool set_if_absent(const std::string& key, const std::string& value);  // false if it existed
  void set(const std::string& key, const std::string& value);            // overwrites
  std::optional<std::string> get(const std::string& key);                // does not wait
  std::vector<bool> exists(const std::vector<std::string>& keys);
  int64_t increment(const std::string& key, int64_t by = 1);  // atomic, returns the new value
  // SET with an expiry (PX): the key vanishes `ttl` after the newest write (heartbeats).
  void set_with_ttl(const std::string& key, const std::string& value, std::chrono::milliseconds ttl);
  // MGET: every key's value, nullopt where absent, in one round trip.
  std::vector<std::optional<std::string>> get_many(const std::vector<std::string>& keys);
  void erase(const std::string& key);  // DEL; nothing if absent
  // DEL only while the key holds `value` (atomic: one Lua script), so a process never deletes
  // what a newer one wrote. Returns whether it deleted.
  bool erase_if_equal(const std::string& key, const std::string& value);
  // SET with an expiry only while the key is absent or holds `value` (atomic: one Lua script),
  // so a process never replaces what another wrote (a heartbeat's claim). Returns whether it set.
  bool set_with_ttl_if_free(const std::string& key, const std::string& value, std::chrono::milliseconds ttl);
  // The key's value and the time it expires (PEXPIRETIME: Unix ms on the server's clock, -1 when
  // it never does), read together; nullopt when absent. A key rewritten with an expiry moves its
  // expiry time, which is how a reader tells a live writer from one that stopped.
  struct Expiring {
    std::string value;
    int64_t expires_at_ms = -1;
  };
  std::optional<Expiring> get_expiring(const std::string& key);
  // Every key that matches the glob `pattern` (SCAN: a cursor over the keyspace, never blocking
  // the server as KEYS would).
  std::vector<std::string> scan(const std::string& pattern);
  // Whether `key`'s value carries a MAC (StoreOptions::records).
  bool authenticated(const std::string& key) const;
  // Waits until all keys exist: at most `timeout` (0 = the store's), then Timeout.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout = {});

  // Keeps `key` = `value` in the store across its restarts: written back (SETNX) on every
  // reconnection. One key per slot: a newer keep() of the slot replaces the older. Does not write
  // now (the caller has written it).
  void keep(const std::string& slot, const std::string& key, const std::string& value);
  // Stops keeping the slot's key (nothing if none).
  void forget(const std::string& slot);
  // `other` writes this store's kept keys back too when its own connection reconnects (a
  // heartbeat thread's connection notices a restart while the main thread computes).
  void share_kept_keys_with(Store& other);
  // Reconnections after a lost connection (a restart of the server, usually), since construction.
  uint64_t reconnections() const;

 private:
  std::string sign(const std::string& key, const std::string& value) const;
  std::optional<std::string> open(const std::string& key, std::optional<std::string> stored) const;
  std::optional<std::string> get_raw(const std::string& key);
  // Deletes `key` when it holds a value without a valid MAC; whether it did.
  bool clear_forged(const std::string& key);

  StoreOptions opts_;
  StoreAddress addr_;
  std::unique_ptr<BoundedRedisStore> redis_;
};

}  // namespace atl
