// Ring attention on the GPU: the CUDA mirror of model/ring_attention.h's
// ring_attention_forward/backward, with the same zigzag layout (ZigzagLayout), ring order and
// results; q, k, v, out, lse and the gradients are device pointers, and each (query chunks,
// key block) step runs on the device (backend/cuda/ring_attention.h).
//
// Transport: the blocks travel through `group` (core/collective.h; Gloo in training) in host
// memory. Each block is copied down once before it is sent and up once after it arrives; the
// device attends to the block in hand while the next one moves (the kernels are queued before
// the exchange is waited for). Why not NCCL's send/recv (NCCL 2.28 here has them): the
// context-parallel group is already a Collective that the CPU ring uses, and NCCL would need a
// communicator per group bootstrapped beside the island's; NCCL refuses two ranks on one GPU, so
// no test could run P ranks on one device; and the HIP build has no NCCL at all. The cost is
// two PCIe copies of a block per step, O(T_r·KVD) against the step's O(T_r²·NH·HD) attention.
//
// Plain C++ (no GPU headers). Every rank of `group` calls together, as on the CPU; a lone rank
// (P = 1) computes causal attention with no transfer.
#pragma once

#include <memory>
#include <vector>

#include "atoll/core/collective.h"
#include "atoll/model/ring_attention.h"

namespace atl::gpu {

// The buffers of one rank's ring, for up to B sequences of the layout's T split over P ranks: two
// device blocks (the one in hand, the one arriving) of the largest rank's [k | v | dk | dv], the
// forward's running sums, D, and their host staging copies. Made once; not thread-safe.
class DeviceRingBuffers {
 public:
  DeviceRingBuffers(const RingDims& d, const ZigzagLayout& z);
  ~DeviceRingBuffers();
  DeviceRingBuffers(const DeviceRingBuffers&) = delete;
  DeviceRingBuffers& operator=(const DeviceRingBuffers&) = delete;

  const RingDims& dims() const;
  const ZigzagLayout& layout() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  friend void ring_attention_forward(float*, float*, const float*, const float*, const float*, int,
                                     DeviceRingBuffers&, Collective&);
  friend void ring_attention_backward(float*, float*, float*, const float*, const float*, const float*, const float*,
                                      const float*, const float*, int, DeviceRingBuffers&, Collective&);
};

// out[B,T_r,NH,HD] (=), lse[B,NH,T_r] (=) for this rank's queries q[B,T_r,NH,HD] over every
// rank's keys and values (k, v [B,T_r,NKV,HD] here), B at most the buffers'. group.size() == z.P.
void ring_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int B,
                            DeviceRingBuffers& buf, Collective& group);

// dq[B,T_r,NH,HD], dk, dv[B,T_r,NKV,HD] (all =) from dout, with out and lse as forward gave them.
void ring_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                             const float* q, const float* k, const float* v, int B, DeviceRingBuffers& buf,
                             Collective& group);

}  // namespace atl::gpu
