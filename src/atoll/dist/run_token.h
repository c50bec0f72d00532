// What the door of a run (membership.h "Trust at the door") would say of a run token, read
// from the store without writing anything: for `atoll doctor`, before any worker starts. It is
// implemented in membership_door.cc, beside the door it mirrors, with the same comparison.
#pragma once

#include <string>

#include "atoll/dist/store.h"

namespace atl {

struct RunTokenVerdict {
  enum class Kind {
    kMatches,          // the run is on the store and holds this token
    kNoneGiven,        // the run holds a token and none was given: a worker would be refused
    kWrong,            // the run holds another token: a worker would be refused
    kRunWithoutToken,  // the run is on the store without a token (started by hand without one)
    kNewRun,           // the run is not on the store yet: the first worker's token will stand
    kOtherRuns,        // the run is not on the store, and the token given is `other_run`'s
  } kind = Kind::kNewRun;
  std::string other_run = {};  // kOtherRuns: the run whose token it is
};

// The store's options().run_id is the run judged; `token` "" = none given.
RunTokenVerdict judge_run_token(Store& store, const std::string& token);

}  // namespace atl
