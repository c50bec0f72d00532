// backend/cuda/nccl.cu in one process: a communicator of one rank (the id, the init, the call
// and the wait all run; the mean of one rank is the data itself, bit for bit), and the
// arguments it refuses. The two-process all-reduce is nccl_two_process_test.cpp.
#include "atoll/backend/cuda/nccl.h"

#include <vector>

#include "atoll/core/errors.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

TEST(CudaNccl, OneRankAllReduceLeavesDataAsItWas) {
  ATOLL_SKIP_WITHOUT_GPU();
  if (!gpu::nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  gpu::NcclComm comm(gpu::nccl_unique_id(), 0, 1);
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  Rng rng(1);
  // 0 (no collective at all), 1, odd, and more than NCCL's per-channel chunks.
  for (const size_t n : {size_t(0), size_t(1), size_t(1023), (size_t(1) << 22) + 5}) {
    SCOPED_TRACE(n);
    const std::vector<float> x = test::randn_f(rng, n);
    test::DeviceVec<float> d(x);
    comm.allreduce_mean(d.get(), n);
    test::expect_equal(d.host(), x, "mean over one rank");
  }
}

TEST(CudaNccl, RefusesBadArguments) {
  ATOLL_SKIP_WITHOUT_GPU();
  if (!gpu::nccl_available()) {  // the stubs refuse everything with the fix
    EXPECT_THROW(gpu::nccl_unique_id(), ConfigError);
    return;
  }
  EXPECT_EQ(gpu::nccl_unique_id().size(), gpu::nccl_unique_id().size());
  EXPECT_NE(gpu::nccl_unique_id(), gpu::nccl_unique_id()) << "two ids must name two rendezvous";
  EXPECT_THROW(gpu::NcclComm("too short", 0, 1), CheckError);
  EXPECT_THROW(gpu::NcclComm(gpu::nccl_unique_id(), 1, 1), CheckError);  // rank outside [0, size)
}

}  // namespace
}  // namespace atl
