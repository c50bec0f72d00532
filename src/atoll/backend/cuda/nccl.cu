#include "atoll/backend/cuda/nccl.h"

#include <cstring>
#include <thread>

#include "atoll/backend/cuda/check.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"

#if defined(ATOLL_WITH_NCCL) && !defined(ATOLL_GPU_HIP)
#include <nccl.h>
#define ATOLL_GPU_HAS_NCCL 1
#else
#define ATOLL_GPU_HAS_NCCL 0
#endif

namespace atl::gpu {

#if ATOLL_GPU_HAS_NCCL

static_assert(kNcclIdBytes == NCCL_UNIQUE_ID_BYTES && sizeof(ncclUniqueId::internal) == kNcclIdBytes);

namespace {

[[noreturn]] void throw_nccl(const char* call, ncclResult_t r, ncclComm_t comm) {
  std::string why = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);  // comm may be null: the thread's last error
  if (last && *last) why += std::string(" (") + last + ")";
  throw GpuError(std::string(call) + " failed: " + why);
}

#define ATOLL_NCCL_CHECK(call, comm)                                   \
  do {                                                                 \
    const ncclResult_t atoll_nr_ = (call);                             \
    if (atoll_nr_ != ncclSuccess) throw_nccl(#call, atoll_nr_, comm);  \
  } while (0)

}  // namespace

bool nccl_available() { return true; }

std::string nccl_unique_id() {
  ncclUniqueId id;
  ATOLL_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
  return std::string(id.internal, sizeof id.internal);
}

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{0};
};

NcclComm::NcclComm(const std::string& unique_id, int rank, int size, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  ATOLL_CHECK(size >= 1 && rank >= 0 && rank < size) << "NCCL rank " << rank << " of " << size;
  ncclUniqueId id;
  ATOLL_CHECK_EQ(unique_id.size(), sizeof id.internal) << "an ncclUniqueId is " << sizeof id.internal << " bytes";
  std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
  impl_->rank = rank, impl_->size = size, impl_->timeout = timeout;
  ATOLL_NCCL_CHECK(ncclCommInitRank(&impl_->comm, size, id, rank), nullptr);
}

NcclComm::~NcclComm() {
  if (impl_ && impl_->comm) (void)ncclCommDestroy(impl_->comm);
}

int NcclComm::rank() const { return impl_->rank; }
int NcclComm::size() const { return impl_->size; }

// On the default stream, so it is ordered after the backward pass that wrote the gradients and
// before the clipping that reads them. NCCL's kernel spins until every rank has joined, so a
// dead peer would hang a plain synchronise: the host polls instead, and past the timeout aborts
// the communicator (which ends the kernel) and throws.
void NcclComm::allreduce_mean(float* data, size_t n) {
  if (n == 0) return;  // every rank has the same n: nobody enters the collective
  ncclComm_t comm = impl_->comm;
  ATOLL_CHECK(comm) << "NCCL communicator used after an abort";
  ATOLL_NCCL_CHECK(ncclAllReduce(data, data, n, ncclFloat32, ncclAvg, comm, nullptr), comm);
  const auto deadline = std::chrono::steady_clock::now() + impl_->timeout;
  for (;;) {
    const cudaError_t q = cudaStreamQuery(nullptr);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) ATOLL_CUDA_CHECK(q);
    ncclResult_t async = ncclSuccess;
    ATOLL_NCCL_CHECK(ncclCommGetAsyncError(comm, &async), comm);
    const bool late = std::chrono::steady_clock::now() > deadline;
    if (async != ncclSuccess || late) {
      const char* why = ncclGetLastError(comm);
      const std::string last = why ? why : "";
      (void)ncclCommAbort(comm);
      impl_->comm = nullptr;
      if (late)
        throw GpuError("NCCL all-reduce of " + std::to_string(n) + " floats: not every rank joined within " +
                       std::to_string(impl_->timeout.count()) + " ms (a peer stopped?); fix: restart the island, "
                       "or raise fault.timeout_s");
      throw GpuError(std::string("NCCL all-reduce failed: ") + ncclGetErrorString(async) + " (" + last + ")");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

#else  // no NCCL in this build

namespace {
[[noreturn]] void no_nccl() {
  throw ConfigError(
      "this build of atoll has no NCCL, which train.device = \"cuda\" needs with more than one worker per island; "
      "fix: install NCCL into the CUDA toolkit (nccl.h, libnccl.so) and rebuild, or use --workers-per-island 1, "
      "or train.device = \"cpu\"");
}
}  // namespace

bool nccl_available() { return false; }
std::string nccl_unique_id() { no_nccl(); }
struct NcclComm::Impl {};
NcclComm::NcclComm(const std::string&, int, int, std::chrono::milliseconds) { no_nccl(); }
NcclComm::~NcclComm() = default;
int NcclComm::rank() const { no_nccl(); }
int NcclComm::size() const { no_nccl(); }
void NcclComm::allreduce_mean(float*, size_t) { no_nccl(); }

#endif

}  // namespace atl::gpu
