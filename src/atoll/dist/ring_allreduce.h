// The quantized ring all-reduce for DiLoCo pseudo-gradients (DESIGN.md, "DiLoCo"): the mean of
// a flat fp32 buffer over a process group, encoded on the wire with a codec (codec.h), built on
// Gloo pairs and unbound buffers (send(dst, slot) / recv(src, slot) / waitSend / waitRecv).
//
// Algorithm (the bandwidth-optimal ring of Patarasuk & Yuan 2009, as in Gloo's
// allreduce_ring_chunked.h, with quantization as in PCCL and Prime Intellect's INTELLECT-1):
//   * The buffer is cut into P segments (sizes differ by at most one element), each segment
//     into chunks of chunk_bytes (whole codec blocks). Chunk k of every segment forms "lane" k,
//     an independent ring: lanes are spread over the group's connections (one thread and one
//     TCP context each), and each thread keeps a few lanes in flight, so encoding and decoding
//     of one lane overlap the transfers of the others.
//   * Reduce-scatter, P-1 steps: rank r sends its running sum of segment (r-t) to r+1, encoded;
//     receives segment (r-t-1) from r-1 and decode-adds it (fp32 accumulation). After the last
//     step rank r holds the full sum of segment r+1: it owns that segment.
//   * The owner divides by P, encodes the mean once and adopts the decoded value itself.
//   * All-gather, P-1 steps: the encoded bytes of each segment travel around the ring unchanged;
//     every rank decodes the same bytes, so every rank ends with bit-identical numbers.
//
// Error: every element is quantized once at each hop of the reduce-scatter (a partial sum of
// t+1 inputs at hop t) and once by its owner, so with A bounding |x| over every rank and every
// element of the codec block, |result - exact mean| <= eps * A * (P+1)/2, eps = the codec's
// relative step (codec_max_error(codec, 1)); plus fp32 summation rounding. ring_error_bound()
// states it; the tests check it against an fp64 mean.
//
// Error feedback (optional): every rank quantizes each element exactly once (a hop send, or the
// owner's encode); the residual (what it meant to contribute minus what the decoded bytes
// contribute, in sum units) is kept per element and added to this rank's input next round, so
// quantization error does not accumulate over rounds (Seide et al. 2014; Karimireddy et al. 2019).
// The residual belongs to the buffer layout: a call with another n starts from zero.
//
// World size 1 still encodes and decodes (and keeps the residual), so a one-island run rounds
// exactly as a many-island run does.
//
// Entropy coding (optional, `compress`): every message's codec bytes go through zstd (level 1)
// when that makes them smaller. Quantized pseudo-gradients are not uniform over their 256 (or
// 16) levels, so int8 shrinks by ~5% (measured on tiny's: 7.5 bits of entropy per byte).
// Lossless, so the result stays bit-identical; all-gather hops forward the compressed bytes as
// received. Wire format with compression: [uint32 LE: bit 31 = compressed, bits 0-30 = payload
// length][payload]; without it, the codec bytes alone.
//
// Failures: a peer that stalls for `timeout` on any message -> Timeout; a closed connection ->
// PeerLost; a member the group knows gone (GroupOptions::lost_ranks: its heartbeat lapsed, asked
// every 100 ms while the lanes run) -> PeerLost at once, without waiting out the timeout. Either way the caller's buffer and the residual are left as they were (the ring
// works on a copy), the other connections' waits are aborted at once, and the group is broken.
// A mean that succeeded here but is discarded (another island failed the same outer step:
// elastic_group.h) is taken back with undo_residual(): the residual before it returns.
//
// Fault injection (core/fault_injection.h): every message sent is a point where ATOLL_FAULT
// can kill or stop this process.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "atoll/dist/codec.h"
#include "atoll/dist/group.h"

namespace atl {

struct RingOptions {
  Codec codec = Codec::kFp32;
  size_t chunk_bytes = size_t{1} << 20;  // fp32 bytes of input per pipelined chunk
  int connections = 0;                   // TCP streams used at once; 0 = all of the group's
  std::chrono::milliseconds timeout{0};  // per message; 0 = the group's
  bool error_feedback = false;
  bool compress = false;  // zstd over the codec bytes (above)
};

struct RingStats {
  uint64_t bytes_sent = 0;   // exact payload bytes this rank sent
  double seconds = 0;        // wall time inside mean()
  double codec_seconds = 0;  // summed over connection threads: encode + decode time
  uint64_t calls = 0;
};

class RingAllreduce {
 public:
  RingAllreduce(ProcessGroup& group, const RingOptions& opts);
  ~RingAllreduce();
  RingAllreduce(const RingAllreduce&) = delete;
  RingAllreduce& operator=(const RingAllreduce&) = delete;

  // data[n] <- mean over the group of data[n] (+ this rank's residual with error feedback),
  // through the codec: bit-identical on every rank. Every rank calls it with the same n.
  void mean(float* data, size_t n);

  const RingOptions& options() const { return opts_; }
  const std::vector<float>& residual() const { return residual_; }  // error feedback state
  void reset_residual() { residual_.clear(), undo_ready_ = false; }
  void set_residual(const float* r, size_t n) { residual_.assign(r, r + n), undo_ready_ = false; }  // from a checkpoint
  // The residual as it was before the last mean(), when that mean succeeded; else nothing.
  void undo_residual();
  RingStats stats() const { return stats_; }

 private:
  struct Conn;        // one connection's lanes, buffers and Gloo unbound buffers (ring_allreduce.cc)
  struct Run;         // one call's geometry and failure state
  class LaneStepper;  // one connection thread's schedule

  void run_connection(Run& run, int c);
  void abort_all();
  void update_stats(uint64_t sent_before, double seconds);

  ProcessGroup& group_;
  RingOptions opts_;
  size_t chunk_ = 0;  // elements per chunk
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<float> work_, residual_, next_residual_;  // after a mean, next_residual_ holds the one before
  bool undo_ready_ = false;
  RingStats stats_;
};

// The stated error of mean() without error feedback, per element: see the header comment.
// `absmax` bounds |x| over every rank and every element within kCodecBlock - 1 of the element.
double ring_error_bound(Codec codec, int world_size, double absmax);

}  // namespace atl
