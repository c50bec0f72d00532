// The small collective interface that model/ (ring attention, tree-attention decoding) and
// ckpt/ use without knowing dist/: dist/'s ProcessGroup implements it over Gloo (dist/group.h),
// and a test may implement it over anything that moves bytes.
//
// Every member calls the collectives (allreduce_sum, allgather) in the same order; point to
// point calls involve only the two ranks named. Failures are the environment's (PeerLost,
// Timeout: core/errors.h), and leave the caller's buffers as the implementation documents.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace atl {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Point to point: the receiver's `bytes` must be the sender's; each direction of a pair
  // matches messages in the order sent.
  virtual void send(const void* data, size_t bytes, int dst) = 0;
  virtual void recv(void* data, size_t bytes, int src) = 0;

  // An exchange in flight: wait() returns once both the send and the receive are done (and
  // rethrows their failure). Destroying one that was not waited for waits for it, swallowing errors.
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void wait() = 0;
  };
  // Starts sending send_data[send_bytes] to dst and receiving recv_data[recv_bytes] from src at
  // once (a ring step: every rank sends to its successor while receiving from its predecessor,
  // which blocking sends would deadlock), so the caller can compute while the bytes move.
  // Neither buffer may be touched (the send one may be read) until wait() returns.
  virtual std::unique_ptr<Pending> exchange(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                                            size_t recv_bytes, int src) = 0;

  // data[n] <- the sum over ranks; allreduce_max: the largest, element by element. Every rank
  // ends with the same bits (tree-attention decoding relies on it: the ranks' logits agree).
  virtual void allreduce_sum(float* data, size_t n) = 0;
  virtual void allreduce_max(float* data, size_t n) = 0;
  // Every rank's blob, in rank order.
  virtual std::vector<std::string> allgather(const std::string& blob) = 0;
};

}  // namespace atl
