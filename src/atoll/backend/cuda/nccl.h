// In-island data parallel on the GPU: an NCCL communicator over the M workers of an island, and
// the all-reduce (average) of the flat fp32 gradient buffer in device memory, in place.
//
// Bootstrap: rank 0 calls nccl_unique_id() and every rank receives those bytes through the
// run's own rendezvous (the island trainer sends them with ProcessGroup::allgather over Gloo),
// then each constructs NcclComm(id, rank, size) on its current device (select_device in
// device.h first). This header stays free of CUDA and NCCL headers (pimpl), and of dist/: the
// exchange of the id is the caller's.
//
// Builds without NCCL (no nccl.h / libnccl under the CUDA toolkit, and every HIP build: Debian
// ships no RCCL) compile stubs: nccl_available() is false and the rest throws ConfigError.
// NCCL failures throw GpuError with NCCL's own message.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace atl::gpu {

// Size of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES), what nccl_unique_id() returns.
constexpr size_t kNcclIdBytes = 128;

// Whether this build has NCCL.
bool nccl_available();

// A fresh ncclUniqueId as raw bytes (rank 0 only; it names rank 0's bootstrap socket).
std::string nccl_unique_id();

class NcclComm {
 public:
  // Collective: all `size` ranks call it with the same id, each with its own rank, on the device
  // it will use. `timeout` bounds every later all-reduce (see allreduce_mean).
  NcclComm(const std::string& unique_id, int rank, int size,
           std::chrono::milliseconds timeout = std::chrono::milliseconds(600000));
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const;
  int size() const;

  // data[n] (device, fp32) (=) the mean over the ranks of everyone's data[n], in place; n may
  // be 0 and must be the same on every rank. Waits until the result is in place: GpuError when
  // NCCL reports an error, or when the ranks have not all joined within the timeout (a peer
  // died); the communicator is then aborted and unusable, and data is undefined.
  void allreduce_mean(float* data, size_t n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace atl::gpu
