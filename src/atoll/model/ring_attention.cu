// The ring of model/device_ring_attention.h: model/ring_attention.cc's two rings step for step,
// with the blocks on the device and their transfers staged through host memory.
#include <algorithm>
#include <cmath>
#include <vector>

#include "atoll/backend/cuda/arena.h"
#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/ring_attention.h"
#include "atoll/core/check.h"
#include "atoll/model/device_ring_attention.h"

namespace atl::gpu {
namespace {

RingChunks chunks_of(const ZigzagLayout& z, int r) {
  RingChunks c;
  c.id[0] = z.first_chunk(r), c.id[1] = z.second_chunk(r);
  c.len[0] = z.chunk_len(c.id[0]), c.len[1] = z.chunk_len(c.id[1]);
  return c;
}

int largest_block(const ZigzagLayout& z) {
  int most = 0;
  for (int r = 0; r < z.P; ++r) most = std::max(most, z.local_len(r));
  return most;
}

void device_copy(float* dst, const float* src, size_t n) {
  if (n) ATOLL_CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice));
}

}  // namespace

struct DeviceRingBuffers::Impl {
  Impl(const RingDims& d_, const ZigzagLayout& z_)
      : d(d_),
        z(z_),
        block(size_t(d_.B) * largest_block(z_) * d_.NKV * d_.HD),
        rows(std::max<size_t>(1, size_t(d_.B) * d_.NH * largest_block(z_))),
        arena(sizeof(float) * (8 * block + rows) + 3 * DeviceArena::kAlign) {
    cur = arena.alloc<float>(4 * block), next = arena.alloc<float>(4 * block);
    sums = arena.alloc<float>(rows);
    host_cur.resize(4 * block), host_next.resize(4 * block);
  }
  // The dims of a call of B sequences (at most the buffers').
  RingDims with_batch(int B) const {
    ATOLL_CHECK(B >= 0 && B <= d.B) << "ring of " << B << " sequences, buffers for " << d.B;
    RingDims c = d;
    c.B = B;
    return c;
  }
  RingDims d;
  ZigzagLayout z;
  size_t block;  // floats of one [k], [v], [dk] or [dv] part of the largest rank's block
  size_t rows;   // floats of [B,NH,T_r] at the largest rank (at least 1)
  DeviceArena arena;
  float *cur, *next;  // [k | v | dk | dv] of the block in hand, and of the one arriving
  float* sums;        // the forward's running sums l, or the backward's D [B,NH,T_r]
  std::vector<float> host_cur, host_next;  // their staging copies
};

namespace {

// The first block in hand is this rank's own [k | v] (own floats each): on the device, and in
// the staging copy that the first send reads when there is a ring.
void hold_own_block(float* cur, float* host_cur, const float* k, const float* v, size_t own, int P) {
  device_copy(cur, k, own);
  device_copy(cur + own, v, own);
  if (P == 1) return;
  copy_to_host(host_cur, k, own * sizeof(float));
  copy_to_host(host_cur + own, v, own * sizeof(float));
}

}  // namespace

DeviceRingBuffers::DeviceRingBuffers(const RingDims& d, const ZigzagLayout& z) {
  ATOLL_CHECK(d.B >= 0 && d.NKV > 0 && d.HD > 0 && d.NH % d.NKV == 0 && z.P >= 1 && z.T >= 0)
      << "ring B=" << d.B << " NH=" << d.NH << " NKV=" << d.NKV << " HD=" << d.HD << " T=" << z.T << " P=" << z.P;
  impl_ = std::make_unique<Impl>(d, z);
}
DeviceRingBuffers::~DeviceRingBuffers() = default;
const RingDims& DeviceRingBuffers::dims() const { return impl_->d; }
const ZigzagLayout& DeviceRingBuffers::layout() const { return impl_->z; }

void ring_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int B,
                            DeviceRingBuffers& buf, Collective& group) {
  DeviceRingBuffers::Impl& w = *buf.impl_;
  const RingDims d = w.with_batch(B);
  const ZigzagLayout& z = w.z;
  const int P = z.P, r = group.rank(), Tq = z.local_len(r);
  ATOLL_CHECK_EQ(group.size(), P) << "ring attention over a group of another size than the layout's";
  const size_t KVD = size_t(d.NKV) * d.HD, own = size_t(d.B) * Tq * KVD;
  ring_forward_start(out, lse, w.sums, d.B, Tq, d.NH, d.HD);  // lse holds the running max until the end
  hold_own_block(w.cur, w.host_cur.data(), k, v, own, P);
  for (int s = 0; s < P; ++s) {
    const auto [src, Tk, Tn, to, from] = RingStep::at(z, r, s);
    const size_t part = size_t(d.B) * Tk * KVD, next_part = size_t(d.B) * Tn * KVD;
    std::unique_ptr<Collective::Pending> moving;
    if (s + 1 < P)
      moving = group.exchange(w.host_cur.data(), 2 * part * sizeof(float), to, w.host_next.data(),
                              2 * next_part * sizeof(float), from);
    // Queued before the wait: the device attends to this block while the next one moves.
    ring_forward_step(out, lse, w.sums, q, Tq, chunks_of(z, r), w.cur, w.cur + part, Tk, chunks_of(z, src), d.B, d.NH,
                      d.NKV, d.HD);
    if (!moving) continue;
    moving->wait();
    copy_to_device(w.next, w.host_next.data(), 2 * next_part * sizeof(float));
    std::swap(w.cur, w.next);
    w.host_cur.swap(w.host_next);
  }
  ring_forward_finish(out, lse, w.sums, d.B, Tq, d.NH, d.HD);
}

void ring_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                             const float* q, const float* k, const float* v, int B, DeviceRingBuffers& buf,
                             Collective& group) {
  DeviceRingBuffers::Impl& w = *buf.impl_;
  const RingDims d = w.with_batch(B);
  const ZigzagLayout& z = w.z;
  const int P = z.P, r = group.rank(), Tq = z.local_len(r);
  ATOLL_CHECK_EQ(group.size(), P) << "ring attention over a group of another size than the layout's";
  const size_t KVD = size_t(d.NKV) * d.HD, QD = size_t(d.NH) * d.HD, own = size_t(d.B) * Tq * KVD;
  float* D = w.sums;
  ring_row_dot(D, dout, out, d.B, Tq, d.NH, d.HD);
  if (size_t n = size_t(d.B) * Tq * QD) ATOLL_CUDA_CHECK(cudaMemset(dq, 0, n * sizeof(float)));
  // The block in hand: [k | v | dk | dv] of B·T_src rows each; this rank's own first.
  hold_own_block(w.cur, w.host_cur.data(), k, v, own, P);
  if (own) ATOLL_CUDA_CHECK(cudaMemset(w.cur + 2 * own, 0, 2 * own * sizeof(float)));
  for (int s = 0; s < P; ++s) {
    const auto [src, Tk, Tn, to, from] = RingStep::at(z, r, s);
    const size_t part = size_t(d.B) * Tk * KVD, next_part = size_t(d.B) * Tn * KVD;
    // As the CPU ring: the next block's [k | v] moves during this block's step, whose [dk | dv]
    // is staged down once it holds this rank's share and follows; the last step sends it home.
    std::unique_ptr<Collective::Pending> kv, grads;
    if (s + 1 < P)
      kv = group.exchange(w.host_cur.data(), 2 * part * sizeof(float), to, w.host_next.data(),
                          2 * next_part * sizeof(float), from);
    float* blk = w.cur;
    ring_backward_step(dq, blk + 2 * part, blk + 3 * part, dout, D, lse, q, Tq, chunks_of(z, r), blk, blk + part, Tk,
                       chunks_of(z, src), d.B, d.NH, d.NKV, d.HD);
    if (P == 1) break;
    copy_to_host(w.host_cur.data() + 2 * part, blk + 2 * part, 2 * part * sizeof(float));  // waits for the step
    grads = group.exchange(w.host_cur.data() + 2 * part, 2 * part * sizeof(float), to,
                           w.host_next.data() + 2 * next_part, 2 * next_part * sizeof(float), from);
    if (kv) kv->wait();
    grads->wait();
    if (s + 1 < P) copy_to_device(w.next, w.host_next.data(), 4 * next_part * sizeof(float));
    std::swap(w.cur, w.next);
    w.host_cur.swap(w.host_next);
  }
  // Home again: this rank's own block, with every rank's share of dk and dv (on the device for
  // a lone rank, in the staging copy after a ring).
  if (P == 1) {
    device_copy(dk, w.cur + 2 * own, own);
    device_copy(dv, w.cur + 3 * own, own);
  } else {
    copy_to_device(dk, w.host_cur.data() + 2 * own, own * sizeof(float));
    copy_to_device(dv, w.host_cur.data() + 3 * own, own * sizeof(float));
  }
}

}  // namespace atl::gpu
