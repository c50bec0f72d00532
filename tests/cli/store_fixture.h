// The command-line tests' fixture with one redis-server per test suite (supervise/redis_server.h),
// for workers started by hand: `store()` is shared by the suite's tests, each with its own run id.
#pragma once

#include "atoll/supervise/redis_server.h"
#include "cli/cli_util.h"

namespace atl::testing {

class CliTestWithStore : public CliTest {
 protected:
  static void SetUpTestSuite() {
    CliTest::SetUpTestSuite();
    redis_ = new RedisServer();
  }
  static void TearDownTestSuite() {
    delete redis_;
    redis_ = nullptr;
    CliTest::TearDownTestSuite();
  }
  static inline RedisServer* redis_ = nullptr;
};

}  // namespace atl::testing
