// Extra environment for the children a test starts (cli_util.h's child_env), for one scope: a
// scheduler's variables, a password. "NAME=VALUE" sets NAME; a bare "NAME" removes it.
#pragma once

#include <string>
#include <vector>

#include "cli/cli_util.h"

namespace atl::testing {

class ScopedChildEnv {
 public:
  explicit ScopedChildEnv(const std::vector<std::string>& vars) : saved_(child_env()) {
    child_env().insert(child_env().end(), vars.begin(), vars.end());
  }
  ~ScopedChildEnv() { child_env() = saved_; }
  ScopedChildEnv(const ScopedChildEnv&) = delete;
  ScopedChildEnv& operator=(const ScopedChildEnv&) = delete;

 private:
  std::vector<std::string> saved_;
};

}  // namespace atl::testing
