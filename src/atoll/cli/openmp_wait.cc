#include "atoll/cli/openmp_wait.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace atl::cli {

void apply_openmp_wait_default(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  // Set before the exec, so the new image finds it and does not exec again.
  if (::setenv("GOMP_SPINCOUNT", kAtollSpinCount, 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  std::fprintf(stderr, "atoll: note: could not restart with GOMP_SPINCOUNT=%s (%s); OpenMP threads spin as long "
               "as libgomp's default, which slows this run when other processes share its cores\n",
               kAtollSpinCount, std::strerror(errno));
}

}  // namespace atl::cli
