// Quantized, pipelined ring all-reduce over Gloo unbound buffers (algorithm in the header).
// Gloo's own chunked ring (gloo/allreduce_ring_chunked.h) is the model for the schedule; the
// differences are the codec on the wire, the owner's single encode (bit-identical results) and
// lanes spread over several TCP contexts.
#include "atoll/dist/ring_allreduce.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/fault_injection.h"
#include "atoll/core/timer.h"
#include "atoll/dist/ring_message.h"
#include "atoll/dist/seal.h"

namespace atl {

namespace {

constexpr int kLanesInFlight = 4;       // lanes one connection thread pipelines at a time
constexpr uint64_t kSlotPrefix = 0xA7;  // top byte of our slots; Gloo's collectives use 0x01..
constexpr int kZstdLevel = 1;                   // ~470 MB/s here: far above the links DiLoCo is for
struct Aborted {};                      // another connection failed first

int mod(int a, int p) { return ((a % p) + p) % p; }

// Segments and lanes of one call: segment s = [seg_begin(s), +seg_len(s)), chunk k of it =
// elements [k*chunk, (k+1)*chunk) of the segment, clipped (possibly empty).
struct Geometry {
  int world = 1;
  size_t n = 0, chunk = 1, lanes = 0;
  size_t seg_begin(int s) const { return s * (n / world) + std::min<size_t>(s, n % world); }
  size_t seg_len(int s) const { return n / world + (static_cast<size_t>(s) < n % world ? 1 : 0); }
  std::pair<size_t, size_t> piece(int s, size_t k) const {  // {offset, length} in the buffer
    const size_t len = seg_len(s), off = k * chunk;
    return off >= len ? std::pair<size_t, size_t>{0, 0}
                      : std::pair<size_t, size_t>{seg_begin(s) + off, std::min(chunk, len - off)};
  }
};

}  // namespace

// One connection: its Gloo context and, per lane slot in flight, two receive and two send
// buffers (alternating by step), each registered once as a Gloo unbound buffer.
struct RingAllreduce::Conn {
  std::shared_ptr<gloo::Context> context;
  std::vector<uint8_t> bytes[kLanesInFlight][4];  // [slot][recv even, recv odd, send even, send odd]
  std::unique_ptr<gloo::transport::UnboundBuffer> ub[kLanesInFlight][4];
  bool pending[kLanesInFlight][4] = {};
  std::vector<float> decoded;  // scratch for error feedback
  std::vector<uint8_t> plain;  // compress: codec bytes before compression / after decompression
  // sealed: the message to send before sealing, and each receive buffer's message once opened
  // (kept for the all-gather's forward at the next step)
  std::vector<uint8_t> clear, opened[kLanesInFlight][2];
  ZSTD_CCtx* cctx = nullptr;
  ZSTD_DCtx* dctx = nullptr;
  ~Conn() {
    ZSTD_freeCCtx(cctx);
    ZSTD_freeDCtx(dctx);
  }
  double codec_seconds = 0;
  uint64_t bytes_sent = 0;
};

// One call of mean().
struct RingAllreduce::Run {
  Geometry g;
  int rank = 0, P = 1, conns = 1;
  uint32_t tag = 0;
  float* work = nullptr;      // input + residual; ends as the result
  float* residual = nullptr;  // next residual (error feedback) or null
  const Sealer* sealer = nullptr;  // the group's (seal.h), or null
  std::string group;               // the group's prefix, bound into sealed frames
  std::string member_left;         // the left neighbour, named in errors
  std::mutex mu;
  std::exception_ptr error;  // the first real failure
  bool failed = false;
  uint64_t slot(int step, size_t lane) const {
    const uint64_t index = static_cast<uint64_t>(step) * g.lanes + lane;
    return (kSlotPrefix << 56) | (static_cast<uint64_t>(tag & 0xffffff) << 32) | index;
  }
};

RingAllreduce::RingAllreduce(ProcessGroup& group, const RingOptions& opts) : group_(group), opts_(opts) {
  ATOLL_CHECK_GE(opts_.chunk_bytes, sizeof(float));
  if (opts_.connections == 0) opts_.connections = group_.connections();
  ATOLL_CHECK(opts_.connections >= 1 && opts_.connections <= group_.connections())
      << "ring connections " << opts_.connections << " but the group has " << group_.connections();
  if (opts_.timeout.count() == 0) opts_.timeout = group_.timeout();
  chunk_ = std::max(kCodecBlock, opts_.chunk_bytes / sizeof(float) / kCodecBlock * kCodecBlock);
  const size_t enc = encoded_bytes(opts_.codec, chunk_);
  // Buffers hold one message: the codec bytes, or with compression a header and at most
  // zstd's bound (a message is sent raw when compression does not shrink it).
  const size_t message = opts_.compress ? kRingHeaderBytes + std::max(enc, ZSTD_compressBound(enc)) : enc;
  const size_t wire = group_.sealer() ? message + kSealOverhead : message;
  const int count = group_.size() > 1 ? opts_.connections : 1;
  for (int c = 0; c < count; ++c) {
    auto conn = std::make_unique<Conn>();
    if (group_.size() > 1) conn->context = group_.context(c);
    for (int j = 0; j < kLanesInFlight; ++j)
      for (int b = 0; b < 4; ++b) {
        conn->bytes[j][b].resize(wire);
        if (conn->context) conn->ub[j][b] = conn->context->createUnboundBuffer(conn->bytes[j][b].data(), wire);
      }
    if (opts_.error_feedback) conn->decoded.resize(chunk_);
    if (group_.sealer()) {
      conn->clear.resize(message);
      for (auto& lane : conn->opened)
        for (auto& b : lane) b.resize(message);
    }
    if (opts_.compress) {
      conn->plain.resize(enc);
      conn->cctx = ZSTD_createCCtx();
      conn->dctx = ZSTD_createDCtx();
      ATOLL_CHECK(conn->cctx && conn->dctx) << "zstd contexts";
      ZSTD_CCtx_setParameter(conn->cctx, ZSTD_c_compressionLevel, kZstdLevel);
    }
    conns_.push_back(std::move(conn));
  }
}

RingAllreduce::~RingAllreduce() = default;

void RingAllreduce::mean(float* data, size_t n) {
  group_.check_usable("ring mean");
  undo_ready_ = false;
  const double t0 = now_s();
  Run run;
  run.rank = group_.rank();
  run.P = group_.size();
  run.g = Geometry{run.P, n, chunk_, (n / run.P + (n % run.P ? 1 : 0) + chunk_ - 1) / chunk_};
  run.conns = static_cast<int>(std::min<size_t>(conns_.size(), std::max<size_t>(run.g.lanes, 1)));
  run.tag = group_.next_tag();
  run.sealer = group_.sealer();
  run.group = group_.prefix();
  if (run.P > 1) run.member_left = group_.member(mod(run.rank - 1, run.P));
  ATOLL_CHECK_LT(2 * static_cast<uint64_t>(run.P) * run.g.lanes, uint64_t{1} << 32)
      << "too many chunks: raise chunk_bytes";
  if (n == 0) return;

  // Work on copies so a failure leaves data[] and the residual as they were.
  work_.assign(data, data + n);
  if (opts_.error_feedback) {
    if (residual_.size() == n)  // another n is another layout: start from zero
      for (size_t i = 0; i < n; ++i) work_[i] += residual_[i];
    next_residual_.resize(n);
    run.residual = next_residual_.data();
  }
  run.work = work_.data();
  const uint64_t sent_before = stats_.bytes_sent;

  {
    // A member known gone (its heartbeat lapsed) fails the run and aborts every wait: it is given
    // up on within the ttl, not after the timeout. A ring that completes as a member goes is
    // failed too (the member is out of the next view anyway, and a failed attempt commits nothing).
    LivenessWatch watch(group_, [&](const std::string& lost) {
      std::lock_guard<std::mutex> failure(run.mu);
      if (run.failed) return;
      run.failed = true;
      run.error = std::make_exception_ptr(gone_while_waiting(lost, "ring"));
      abort_all();
    });
    run_parallel(run.conns, [&](int c) { run_connection(run, c); });
  }
  if (run.error) {
    try {
      std::rethrow_exception(run.error);
    } catch (...) {
      group_.fail("ring mean (" + std::string(codec_name(opts_.codec)) + ", " + std::to_string(n) + " floats)",
                  opts_.timeout);
    }
  }
  std::memcpy(data, work_.data(), n * sizeof(float));
  if (opts_.error_feedback) residual_.swap(next_residual_), undo_ready_ = true;
  update_stats(sent_before, now_s() - t0);
}

void RingAllreduce::undo_residual() {
  if (undo_ready_) residual_.swap(next_residual_);
  undo_ready_ = false;
}

void RingAllreduce::update_stats(uint64_t sent_before, double seconds) {
  stats_.bytes_sent = 0;
  stats_.codec_seconds = 0;
  for (auto& c : conns_) {
    stats_.bytes_sent += c->bytes_sent;
    stats_.codec_seconds += c->codec_seconds;
  }
  stats_.seconds += seconds;
  stats_.calls += 1;
  group_.record(stats_.bytes_sent - sent_before, seconds);
}

void RingAllreduce::abort_all() {
  for (auto& c : conns_)
    for (auto& lane : c->ub)
      for (auto& ub : lane)
        if (ub) {
          ub->abortWaitRecv();
          ub->abortWaitSend();
        }
}

// The steps of one connection thread: lanes c, c+C, c+2C, ... in groups of kLanesInFlight.
class RingAllreduce::LaneStepper {
 public:
  LaneStepper(Conn& conn, Run& run, const RingOptions& opts)
      : conn_(conn), run_(run), opts_(opts), steps_(2 * (run.P - 1)) {}

  void run_lanes(size_t first, size_t stride) {
    std::vector<size_t> lanes;
    for (size_t k = first; k < run_.g.lanes; k += stride) {
      lanes.push_back(k);
      if (lanes.size() == kLanesInFlight) {
        run_group(lanes);
        lanes.clear();
      }
    }
    if (!lanes.empty()) run_group(lanes);
  }

 private:
  // Segments rank r sends and receives at step t (reduce-scatter, then all-gather).
  int send_seg(int t) const {
    return t < run_.P - 1 ? mod(run_.rank - t, run_.P) : mod(run_.rank + 1 - (t - run_.P + 1), run_.P);
  }
  int recv_seg(int t) const {
    return t < run_.P - 1 ? mod(run_.rank - t - 1, run_.P) : mod(run_.rank - (t - run_.P + 1), run_.P);
  }
  int left() const { return mod(run_.rank - 1, run_.P); }
  int right() const { return mod(run_.rank + 1, run_.P); }

  // Pipelined schedule: every lane of the group advances one step at a time; a lane's next
  // receive is posted before its current data is processed, and its next send goes out as soon
  // as that data is ready, while the other lanes' transfers are in flight.
  void run_group(const std::vector<size_t>& lanes) {
    if (run_.P == 1) {
      for (size_t j = 0; j < lanes.size(); ++j) finalize_owned(lanes[j], conn_.bytes[j][0].data());
      return;
    }
    for (size_t j = 0; j < lanes.size(); ++j) {
      post_recv(j, lanes[j], 0);
      prepare_and_send(j, lanes[j], 0);
    }
    for (int t = 0; t < steps_; ++t)
      for (size_t j = 0; j < lanes.size(); ++j) {
        wait(j, t % 2, /*send=*/false);
        if (t + 1 < steps_) post_recv(j, lanes[j], t + 1);
        process_recv(j, lanes[j], t);
        if (t + 1 < steps_) prepare_and_send(j, lanes[j], t + 1);
      }
    for (size_t j = 0; j < lanes.size(); ++j) {  // the last two sends of each lane
      wait(j, 2, true);
      wait(j, 3, true);
    }
  }

  void post_recv(size_t j, size_t lane, int t) {
    const auto [off, len] = run_.g.piece(recv_seg(t), lane);
    if (len == 0) return;
    conn_.ub[j][t % 2]->recv(left(), run_.slot(t, lane), 0, conn_.bytes[j][t % 2].size());
    conn_.pending[j][t % 2] = true;
  }

  void process_recv(size_t j, size_t lane, int t) {
    const auto [off, len] = run_.g.piece(recv_seg(t), lane);
    if (len == 0) return;
    ScopedTimer timer(&conn_.codec_seconds);
    const uint8_t* msg = received(j, lane, t);
    const uint8_t* in = opts_.compress ? unwrap(msg, len) : msg;
    if (t < run_.P - 1)
      decode_add(opts_.codec, in, len, run_.work + off);
    else
      decode(opts_.codec, in, len, run_.work + off);
  }

  void prepare_and_send(size_t j, size_t lane, int t) {
    const auto [off, len] = run_.g.piece(send_seg(t), lane);
    if (len == 0) return;
    const int b = 2 + t % 2;
    wait(j, b, true);  // the send two steps back used this buffer
    const Sealer* sealer = group_sealer();
    uint8_t* out = sealer ? conn_.clear.data() : conn_.bytes[j][b].data();  // the message, sealed into bytes[j][b]
    size_t bytes = encoded_bytes(opts_.codec, len);
    if (t < run_.P - 1) {
      ScopedTimer timer(&conn_.codec_seconds);
      uint8_t* codec_out = opts_.compress ? conn_.plain.data() : out;
      encode(opts_.codec, run_.work + off, len, codec_out);
      if (run_.residual) keep_residual(codec_out, off, len, 1.0f);
      if (opts_.compress) bytes = wrap(codec_out, bytes, out);
    } else if (t == run_.P - 1) {
      bytes = finalize_owned(lane, out);
    } else {  // forward the message received at the previous step, unchanged (sealed again for the next hop)
      const uint8_t* in = sealer ? conn_.opened[j][(t - 1) % 2].data() : conn_.bytes[j][(t - 1) % 2].data();
      if (opts_.compress) bytes = ring_message_size(in, message_capacity());
      std::memcpy(out, in, bytes);
    }
    if (sealer) bytes = sealer->seal(out, bytes, frame(t, lane, run_.rank, right()), conn_.bytes[j][b].data());
    if (fault_ring_message()) conn_.bytes[j][b][bytes / 2] ^= 0x5a;  // ATOLL_FAULT corrupt: a byte altered on the wire
    conn_.ub[j][b]->send(right(), run_.slot(t, lane), 0, bytes);
    conn_.pending[j][b] = true;
    conn_.bytes_sent += bytes;
  }

  // The owner's segment (rank+1) holds the full sum: divide by P, encode once into out, and
  // adopt the decoded value, exactly what every other rank will decode. Returns the message's
  // size in bytes.
  size_t finalize_owned(size_t lane, uint8_t* out) {
    const auto [off, len] = run_.g.piece(mod(run_.rank + 1, run_.P), lane);
    if (len == 0) return 0;
    ScopedTimer timer(&conn_.codec_seconds);
    float* w = run_.work + off;
    const float p = static_cast<float>(run_.P);
    for (size_t i = 0; i < len; ++i) w[i] /= p;
    uint8_t* codec_out = opts_.compress ? conn_.plain.data() : out;
    encode(opts_.codec, w, len, codec_out);
    if (run_.residual) keep_residual(codec_out, off, len, p);
    decode(opts_.codec, codec_out, len, w);
    const size_t bytes = encoded_bytes(opts_.codec, len);
    return opts_.compress && run_.P > 1 ? wrap(codec_out, bytes, out) : bytes;
  }

  size_t wrap(const uint8_t* codec_bytes, size_t bytes, uint8_t* out) {
    return wrap_ring_message(conn_.cctx, codec_bytes, bytes, out, message_capacity());
  }

  // A message's room: the buffers' size less the seal's.
  size_t message_capacity() const {
    return conn_.bytes[0][0].size() - (group_sealer() ? kSealOverhead : 0);
  }
  const Sealer* group_sealer() const { return run_.sealer; }

  // The frame of lane `lane` at step t from `sender` to `receiver`: bound to the group (run,
  // epoch), the call's tag and the message's slot, so no frame opens at another place.
  FrameContext frame(int t, size_t lane, int sender, int receiver) const {
    return {.group = run_.group, .purpose = SealPurpose::kRing, .sender = sender, .receiver = receiver,
            .round = run_.tag, .seq = run_.slot(t, lane)};
  }

  // The message received at step t into lane slot j: the buffer itself, or opened (sealed).
  const uint8_t* received(size_t j, size_t lane, int t) {
    const std::vector<uint8_t>& in = conn_.bytes[j][t % 2];
    if (!group_sealer()) return in.data();
    uint8_t* plain = conn_.opened[j][t % 2].data();
    group_sealer()->open(in.data(), in.size(), frame(t, lane, left(), run_.rank), plain, run_.member_left);
    return plain;
  }

  // The codec bytes of a received message of `len` elements (decompressed into conn_.plain).
  const uint8_t* unwrap(const uint8_t* msg, size_t len) {
    return unwrap_ring_message(conn_.dctx, msg, message_capacity(), encoded_bytes(opts_.codec, len), conn_.plain);
  }

  // residual = scale * (what we meant - what the bytes decode to), in sum units.
  void keep_residual(const uint8_t* bytes, size_t off, size_t len, float scale) {
    float* d = conn_.decoded.data();
    decode(opts_.codec, bytes, len, d);
    for (size_t i = 0; i < len; ++i) run_.residual[off + i] = scale * (run_.work[off + i] - d[i]);
  }

  // Waits for buffer b's pending operation; a failure elsewhere aborts the wait.
  void wait(size_t j, int b, bool send) {
    if (!conn_.pending[j][b]) return;
    conn_.pending[j][b] = false;
    auto& ub = conn_.ub[j][b];
    const bool done = send ? ub->waitSend(opts_.timeout) : ub->waitRecv(opts_.timeout);
    if (!done) throw Aborted{};
  }

  Conn& conn_;
  Run& run_;
  const RingOptions& opts_;
  const int steps_;
};

void RingAllreduce::run_connection(Run& run, int c) {
  Conn& conn = *conns_[c];
  for (auto& lane : conn.pending) std::fill(std::begin(lane), std::end(lane), false);
  try {
    LaneStepper(conn, run, opts_).run_lanes(c, run.conns);
  } catch (const Aborted&) {
    // another connection failed first and aborted our waits; its error is the one reported
  } catch (...) {
    std::lock_guard<std::mutex> lock(run.mu);
    if (!run.failed) {
      run.failed = true;
      run.error = std::current_exception();
      abort_all();
    }
  }
}

double ring_error_bound(Codec codec, int world_size, double absmax) {
  // Hop t sends a partial sum of t+1 inputs plus the errors of the hops before it.
  double sum_error = 0;
  for (int t = 0; t + 1 < world_size; ++t) sum_error += codec_max_error(codec, (t + 1) * absmax + sum_error);
  const double mean_error = sum_error / world_size;
  const double owner_error = codec_max_error(codec, absmax + mean_error);
  const double fp32_rounding = (world_size + 1) * absmax * (1.0 / (1 << 22));  // sums and the division
  return mean_error + owner_error + fp32_rounding;
}

}  // namespace atl
