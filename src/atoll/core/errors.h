// Typed exceptions for failures of the environment: bad user input, corrupt files, lost peers.
// Callers can catch and survive them; the CLI prints what() as one line and exits non-zero.
// Messages name the file, the field and the fix.
#pragma once

#include <stdexcept>
#include <string>

namespace atl {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ConfigError : public Error {  // unknown key, wrong type, value out of range
 public:
  using Error::Error;
};
class DataError : public Error {  // missing/empty/corrupt corpus, shard or tokenizer
 public:
  using Error::Error;
};
class IoError : public Error {  // a file or directory could not be read or written
 public:
  using Error::Error;
};
class CorruptCheckpoint : public Error {  // truncated, wrong checksum, other model shape
 public:
  using Error::Error;
};
// An intact checkpoint of another model shape than the one expected (not damage: a resume does
// not skip it for an older one).
class OtherModelCheckpoint : public CorruptCheckpoint {
 public:
  using CorruptCheckpoint::CorruptCheckpoint;
};
class RunDirConflict : public Error {  // run directory holds a different run
 public:
  using Error::Error;
};
class Timeout : public Error {
 public:
  using Error::Error;
};
class PeerLost : public Error {
 public:
  using Error::Error;
};
// This worker is no longer a member of an elastic run (its island lost a worker, or the others
// re-formed without it): it must leave, and rejoin as a new process (`atoll worker --join`).
class LeftRun : public Error {
 public:
  using Error::Error;
};

}  // namespace atl
