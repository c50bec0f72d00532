// The links between the hosts of a run, tried before it starts (`atoll doctor`, doctor.h):
// doctors started on several hosts with the same run id meet through the store and each opens a
// TCP connection to every other's listen address, the address and kind of port (the kernel's
// pick, as Gloo's pairs) a worker of that host would use. What one cannot reach is named on
// both ends: each reports back through the store whom it could not reach.
//
// Keys (never under the run's own prefix "atoll/<run>/", so a run never reads them):
//   atoll-doctor/<run>/peer/<nonce>  a doctor's listen address, host and place (JSON), with an
//                                    expiry of 10 s that it renews each second while it meets
//                                    the others, deleted when it is done
//   atoll-doctor/<run>/done/<nonce>  the nonces it could not reach (JSON), expiring after the
//                                    wait plus 10 s, once the others have had time to read it
// A doctor that dies leaves keys that expire by themselves. Every wait is bounded by `wait`,
// every connection by `connect_timeout`.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "atoll/dist/store.h"

namespace atl {

struct PeerMeetingOptions {
  std::string run_id;
  std::string who;      // this doctor's place ("island 0 rank 1"; "" = none), for the others' lines
  std::string address;  // the listen address, and the port listen_fd is bound to
  int port = 0;
  int listen_fd = -1;   // bound and listening; answered until meet_peers returns
  int peers = 2;        // doctors to meet, this one included
  std::chrono::milliseconds wait{60000}, connect_timeout{5000};
};

struct PeerMeeting {
  int met = 1;                          // doctors seen, this one included
  std::vector<std::string> reached;     // "island 1 rank 0 on h2 (10.0.0.2:41234, 0.4 ms)"
  std::vector<std::string> unreached;   // "island 1 rank 0 on h2 (10.0.0.2:41234): Connection refused"
  std::vector<std::string> unreached_by;  // doctors that could not reach this one
  std::vector<std::string> silent;      // met, but did not report back within the wait
};

PeerMeeting meet_peers(Store& store, const PeerMeetingOptions& opts);

}  // namespace atl
