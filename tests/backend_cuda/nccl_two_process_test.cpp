// backend/cuda/nccl.cu across two real processes, each on its own GPU: the all-reduce mean of
// awkward sizes against the mean computed on the host. A file of its own because CUDA does not
// survive fork(): the parent here never touches the GPU (its device check runs in a child), so
// the forked ranks start with a clean runtime.
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "atoll/backend/cuda/arena.h"
#include "atoll/backend/cuda/device.h"
#include "atoll/backend/cuda/nccl.h"
#include "dist/dist_test_util.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

constexpr int kRanks = 2;

// In a child, so the parent's runtime stays uninitialised: "<device count>" or "0 <why>".
std::string probe_devices() {
  return testing::run_processes(1, [](int) {
    std::string why;
    int count = 0;
    if (test::gpu_available(&why)) ATOLL_CUDA_CHECK(cudaGetDeviceCount(&count));
    return std::to_string(count) + (count ? "" : " " + why);
  })[0];
}

// Every rank's input element i, known to all ranks (each checks the result on its own).
float input(int rank, size_t i) { return testing::test_value(7, rank, i); }

// One rank: select_device(rank), the communicator from rank 0's id (sent through a pipe, as
// the island trainer sends it through the store), then the all-reduce of each size. Returns ""
// or what went wrong. Two ranks: halving is exact and the sum rounds once, so the device's
// mean equals the host's float((a + b) / 2) bit for bit; one ulp is allowed in case NCCL
// divides after the sum (the same bits too, barring subnormals, which these inputs avoid).
std::string run_rank(int rank, int id_pipe[2]) {
  gpu::select_device(rank);
  std::string id(gpu::kNcclIdBytes, '\0');
  if (rank == 0) {
    id = gpu::nccl_unique_id();
    for (int r = 1; r < kRanks; ++r)
      if (::write(id_pipe[1], id.data(), id.size()) != ssize_t(id.size())) return "writing the id failed";
  } else {
    size_t got = 0;
    while (got < id.size()) {
      const ssize_t n = ::read(id_pipe[0], id.data() + got, id.size() - got);
      if (n <= 0) return "reading the id failed";
      got += size_t(n);
    }
  }
  gpu::NcclComm comm(id, rank, kRanks, std::chrono::milliseconds(60000));
  std::string errors;
  for (const size_t n : {size_t(0), size_t(1), size_t(1023), (size_t(1) << 22) + 5}) {
    std::vector<float> x(n), want(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = input(rank, i);
      want[i] = (input(0, i) + input(1, i)) * 0.5f;
    }
    test::DeviceVec<float> d(x);
    comm.allreduce_mean(d.get(), n);
    const std::vector<float> got = d.host();
    for (size_t i = 0; i < n; ++i)
      if (!(std::fabs(got[i] - want[i]) <= 0x1p-23f * std::fabs(want[i]))) {
        errors += "n=" + std::to_string(n) + " [" + std::to_string(i) + "]: " + std::to_string(got[i]) + " vs " +
                  std::to_string(want[i]) + "; ";
        break;
      }
  }
  return errors;
}

TEST(CudaNcclTwoProcesses, AllReduceMeanMatchesHost) {
  const std::string probe = probe_devices();
  const int devices = std::stoi(probe);
  if (devices == 0) GTEST_SKIP() << "no CUDA device: " << probe.substr(probe.find(' ') + 1);
  if (!gpu::nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  // NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected").
  if (devices < kRanks) GTEST_SKIP() << "needs " << kRanks << " CUDA devices, found " << devices;
  int id_pipe[2];
  ASSERT_EQ(::pipe(id_pipe), 0);
  const std::vector<std::string> out =
      testing::run_processes(kRanks, [&](int rank) { return run_rank(rank, id_pipe); }, std::chrono::seconds(120));
  ::close(id_pipe[0]);
  ::close(id_pipe[1]);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(out[size_t(r)], "") << "rank " << r;
}

}  // namespace
}  // namespace atl
