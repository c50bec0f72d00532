#include "atoll/cli/openmp_wait.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace atl::cli {
namespace {

// Set beside GOMP_SPINCOUNT for the restarted image only, so it knows the value is atoll's.
constexpr const char* kSetByAtoll = "ATOLL_GOMP_SPINCOUNT_SET";

void forget_atolls_setting() {
  ::unsetenv("GOMP_SPINCOUNT");
  ::unsetenv(kSetByAtoll);
}

}  // namespace

void apply_openmp_wait_default(char** argv) {
  if (std::getenv(kSetByAtoll) != nullptr) {
    // The restarted image: libgomp has read the value. The processes this one starts (launch's
    // workers, redis-server) see the user's environment again and make their own choice.
    forget_atolls_setting();
    return;
  }
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (::setenv("GOMP_SPINCOUNT", kAtollSpinCount, 1) != 0 || ::setenv(kSetByAtoll, "1", 1) != 0) {
    forget_atolls_setting();
    return;
  }
  ::execv("/proc/self/exe", argv);
  const int error = errno;
  forget_atolls_setting();
  std::fprintf(stderr, "atoll: note: could not restart with GOMP_SPINCOUNT=%s (%s); OpenMP threads spin as long "
               "as libgomp's default, which slows this run when other processes share its cores\n",
               kAtollSpinCount, std::strerror(error));
}

}  // namespace atl::cli
