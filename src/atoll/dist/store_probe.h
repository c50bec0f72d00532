// One short look at a Redis store, for `atoll doctor` (docs/cluster.md "atoll doctor"): does it
// answer within a bound, does it take the password, and how far its clock is from this host's.
// Unlike Store (store.h), which retries until its timeout and throws, the probe makes one
// connection, never retries, never writes, and reports what it found: the doctor turns each
// finding into a line with its fix.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "atoll/dist/store.h"

namespace atl {

struct StoreProbe {
  bool reached = false;    // a TCP connection was made within the bound
  bool answers = false;    // it answered PING with PONG (after AUTH, when a password was given)
  enum class Auth { kNotAsked, kAccepted, kRefused, kRequired } auth = Auth::kNotAsked;
  std::string error;       // why not (the socket's error, or the store's reply), "" when it answers
  double connect_ms = 0;   // the TCP connect
  // The store's clock (Redis TIME) minus this host's (the system clock), in seconds, from the
  // sample with the shortest round trip of a few, taken at its middle; the error is at most
  // half that round trip. nullopt when TIME gave no answer.
  std::optional<double> clock_offset_s;
  double clock_error_s = 0;
};

// Every step is bounded by `timeout`: the connect and each command.
StoreProbe probe_store(const StoreAddress& store, std::chrono::milliseconds timeout);

}  // namespace atl
