// A process group: `size` processes that found each other through the store and hold Gloo TCP
// connections to one another (Gloo's rendezvous::Context, full mesh). Inside an island the
// workers form one group and all-reduce gradients every step (allreduce_sum); across islands
// the workers of the same local rank form another and run the quantized ring (ring_allreduce.h).
//
// Layering follows Gloo: the store does rendezvous only (store.h), Gloo's TCP transport moves
// bytes, algorithms (Gloo's own, or ring_allreduce.h on Gloo unbound buffers) sit on top.
//
// Connections: `connections` independent Gloo contexts for the same members, each on its own
// TCP device (own sockets, own event-loop thread), so bulk transfers can use several TCP streams
// at once; one stream rarely fills a fast link. Collectives that move little (barrier,
// broadcast, allgather) use connection 0.
//
// Membership epoch: part of every store key of the group ("atoll/<run>/<name>/e<epoch>/...").
// After a failure (Timeout or PeerLost) the group is broken: its collectives refuse to run, and
// the survivors form a new group with a higher epoch (elastic_group.h).
//
// Timeouts: rendezvous waits at most `timeout` in all for every peer (capped by the store's
// timeout), less when GroupOptions::lost_ranks names a member that cannot come any more;
// every collective waits at most `timeout` for any one message. Failures raise Timeout (a peer
// stalled or never came: the message names the missing ranks when it can) or PeerLost (a peer's
// connection closed or broke). Every collective leaves the caller's buffers unchanged on failure.
// A collective that times out names the member that stalled: each member whose collective fails
// marks it in the store, and one that timed out waits (half as long as it waited, at most 2 s,
// less once every member still unmarked is known gone) for the others' marks; those that never mark are
// the ones that stalled ("stalled: island 2 rank 0", by member_name).
// With GroupOptions::lost_ranks, no wait outlasts a member known gone: the rendezvous checks it
// between slices, and the collectives atoll runs on its own unbound buffers (barrier, allgather,
// reduce_scatter_sum, the ring of ring_allreduce.h) abort their waits through a LivenessWatch:
// PeerLost within the heartbeat ttl, not after the timeout. Gloo's own collectives here
// (broadcast, gather, allgatherv, allreduce_sum) cannot be aborted and wait for the timeout.
//
// A member that dies between publishing its address and its peers' connects (as long as the
// others take to arrive) is waited for in Gloo's pair connect, which cannot be interrupted: with
// lost_ranks for a quarter of the timeout (at least 1 s), then named if known gone; else the timeout.
//
// Sizes: every rank states in the store the group size it was started with, and a rank whose
// size differs from a peer's is refused with GroupSizeMismatch naming both, rather than failing
// inside Gloo's rendezvous on an address block of another length.
//
// The constructor ignores SIGPIPE for the process if it had the default action, so writing to
// a dead peer's socket raises PeerLost instead of killing the process.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "atoll/core/collective.h"
#include "atoll/core/errors.h"
#include "atoll/dist/store.h"

namespace gloo {
class Context;
}

namespace atl {

class Sealer;  // seal.h

struct GroupOptions {
  std::string name = "world";  // e.g. "island0" (in-island) or "outer-r0" (across islands)
  int rank = 0;
  int size = 1;
  uint64_t epoch = 0;                  // membership epoch, part of every key prefix
  // Address this process listens on (Gloo binds port 0). Empty: choose_listen_address
  // (listen_address.h): 127.0.0.1 when the store is on loopback, else the local address the
  // kernel routes towards the store's host, so a worker started by hand on another machine (or
  // network namespace) is reachable with no flag.
  std::string hostname{};
  std::string iface{};                 // or a network interface name, e.g. "eth0" (wins if set)
  int connections = 1;                 // TCP contexts per group (streams per peer)
  std::chrono::milliseconds timeout{30000};
  size_t bucket_bytes = size_t{16} << 20;  // allreduce_sum: fused bucket size (fp32 bytes)
  // How errors name a member, e.g. "island 2 rank 0" for rank 2 of an outer group (empty:
  // "rank 2").
  std::function<std::string(int rank)> member_name{};
  // The ranks known gone (an elastic run: those whose heartbeat lapsed, membership.h), asked
  // between slices of the waits that a gone member would otherwise leave to run out: the
  // rendezvous, which then gives up at once with PeerLost naming them, a ring mean
  // (ring_allreduce.h), which fails the same way while it waits, and a failed collective's
  // wait for the others' marks. Called from other threads than the group's caller. A member that is only slow is not in it and is waited for up to
  // the timeout. Empty: none is known gone before the timeout.
  std::function<std::vector<int>()> lost_ranks{};
  // Seals every message of the group's own collectives (barrier, allgather, broadcast, send/recv)
  // and of the ring (ring_allreduce.h) with the run's keys (seal.h): the outer group between
  // islands. Gloo's own collectives (allreduce_sum, gather, allgatherv) and reduce_scatter_sum stay
  // unsealed (used inside an island, and by the data-parallel warm-up); exchange() is refused.
  // Null: nothing sealed.
  std::shared_ptr<const Sealer> sealer{};
};

// How often the waits that GroupOptions::lost_ranks can end (the rendezvous, a ring mean, the
// wait for failure marks) ask it: one MGET of the heartbeats each time.
inline constexpr std::chrono::milliseconds kLivenessPoll{100};

// A rank started with another group size than a peer's (e.g. a worker given another
// --islands): this rank's rank and size, and the first peer found with another size.
class GroupSizeMismatch : public ConfigError {
 public:
  GroupSizeMismatch(const std::string& what, int rank, int size, int peer, int peer_size)
      : ConfigError(what), rank(rank), size(size), peer(peer), peer_size(peer_size) {}
  int rank, size, peer, peer_size;
};

// What a process sent and how long it spent in collectives: comm_bytes and comm_s in
// metrics.jsonl (DESIGN.md). Gloo's own algorithms count the bytes of their schedule (ring
// all-reduce: 2(P-1)/P of the buffer per rank); the quantized ring counts exact bytes.
struct CommStats {
  uint64_t bytes_sent = 0;
  double seconds = 0;
  uint64_t ops = 0;
};

class ProcessGroup final : public Collective {
 public:
  // Rendezvous through `store` (used only while constructing; it need not outlive the group).
  // Throws Timeout naming the ranks that never arrived, ConfigError if this rank already joined.
  ProcessGroup(Store& store, const GroupOptions& opts);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const override { return opts_.rank; }
  int size() const override { return opts_.size; }
  uint64_t epoch() const { return opts_.epoch; }
  int connections() const { return opts_.connections; }
  std::chrono::milliseconds timeout() const { return opts_.timeout; }
  const GroupOptions& options() const { return opts_; }
  const std::string& prefix() const { return prefix_; }  // "atoll/<run>/<name>/e<epoch>"
  std::string describe() const;                          // "group 'world' epoch 0, rank 1 of 4"

  // Collectives: every rank calls the same ones in the same order.
  void barrier();
  // data[bytes] <- root's data[bytes]: the root sends to every other rank directly, on the
  // group's own unbound buffers (a LivenessWatch can abort their waits, not Gloo's broadcast);
  // the others receive into a scratch copy first, so a failure leaves data unchanged.
  void broadcast(void* data, size_t bytes, int root);
  // Every rank's blob, in rank order (blobs may differ in size).
  std::vector<std::string> allgather(const std::string& blob) override;
  // Root's out[size() * bytes] <- every rank's data[bytes], in rank order; `out` is ignored
  // elsewhere. For bulk data only one rank needs (checkpoints): the others hold nothing extra.
  void gather(const void* data, size_t bytes, void* out, int root);
  // In place: data[sum(counts)] holds rank r's counts[r] floats at offset sum(counts[0..r));
  // every rank ends with every rank's part (its own part is sent, the others overwritten).
  void allgatherv(float* data, const std::vector<size_t>& counts);
  // In place, the converse: data[sum(counts)] holds this rank's whole vector, and on return
  // rank r's part (counts[r] floats at offset sum(counts[0..r))) holds the sum of every rank's
  // part r; the other parts are left as they were. A ring of P-1 steps (each rank sends and
  // receives one part a step), so part r is summed in ring order from rank r+1 round to r:
  // with two ranks a + b, bit for bit Gloo's all-reduce sum (the order of two does not matter).
  void reduce_scatter_sum(float* data, const std::vector<size_t>& counts);
  // Throws ConfigError on every rank if some rank's `value` differs from rank 0's, e.g.
  // expect_same("model config", toml) -> "rank 2's model config differs from rank 0's at ...".
  void expect_same(const std::string& what, const std::string& value);
  // data[n] <- sum over ranks, with Gloo's ring all-reduce in buckets of bucket_bytes spread
  // over the connections. On failure data[n] is unchanged (the sum goes to a scratch copy).
  void allreduce_sum(float* data, size_t n) override;
  // The same with the largest value in place of the sum (Gloo's ring, so every rank ends with
  // the same bits).
  void allreduce_max(float* data, size_t n) override;

  // Point to point, only the two ranks taking part (not a collective: no tag of the group's
  // sequence is used). Each direction of a pair matches its messages in the order sent, so the
  // receiver's `bytes` must be the sender's. A send returns once the receiver has taken the
  // message (Gloo sends only to a posted receive). The waits give up on a member known gone
  // (LivenessWatch); on failure recv's data may hold part of the message.
  void send(const void* data, size_t bytes, int dst) override;
  void recv(void* data, size_t bytes, int src) override;
  // Both at once (Collective::exchange), on the same per-pair message order as send and recv.
  std::unique_ptr<Pending> exchange(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                                    size_t recv_bytes, int src) override;

  // For algorithms built on the group's connections (ring_allreduce.h).
  const std::shared_ptr<gloo::Context>& context(int connection) const;
  uint32_t next_tag() { return tag_++; }  // same sequence on every rank
  void record(uint64_t bytes_sent, double seconds);
  CommStats stats() const;
  bool broken() const { return broken_; }
  void check_usable(const char* op) const;  // PeerLost if an earlier collective failed
  void direct(void* data, size_t bytes, int peer, bool sending);  // send / recv
  // Inside a catch block: marks the group broken and rethrows the current exception as
  // Timeout or PeerLost (Gloo's exceptions translated) with `op` and describe() in front; a
  // timeout (after `waited`, 0 = the group's timeout) also names the members that stalled.
  [[noreturn]] void fail(const std::string& op, std::chrono::milliseconds waited = {});
  // "rank 2", or what GroupOptions::member_name says.
  std::string member(int rank) const;
  // The other members GroupOptions::lost_ranks says are gone, named and joined by ", " ("" when
  // none, or without lost_ranks). Thread-safe when lost_ranks is.
  std::string lost_members() const;
  bool watches_liveness() const { return bool(opts_.lost_ranks); }
  const Sealer* sealer() const { return opts_.sealer.get(); }

 private:
  class DirectExchange;  // exchange()'s Pending
  using ReduceFn = void (*)(void*, const void*, const void*, size_t);
  void allreduce(float* data, size_t n, const char* op, ReduceFn fn);
  void connect(Store& store, int connection);
  // Waits (at most the rendezvous bound) until every rank has stated its size, throwing
  // GroupSizeMismatch at once for one that stated another; check_sizes looks once at the ranks
  // not yet `checked` and says whether every rank has stated one.
  void await_sizes(Store& store) const;
  // PeerLost naming the members GroupOptions::lost_ranks says are gone, `during` in front; none: returns.
  void check_lost(const std::string& during) const;
  bool check_sizes(Store& store, std::vector<bool>& checked) const;
  [[noreturn]] void connect_failed(Store& store, int connection) const;  // in a catch block
  void throw_if_missing(Store& store) const;  // Timeout naming the ranks that never arrived, if any
  // Marks this member's failed collective in the store; with a `wait`, waits that long for the
  // others' marks and returns "; stalled: <members that never marked>".
  std::string mark_failed(std::chrono::milliseconds wait) const;
  // Whether every one of `ranks` not `marked` is known gone (GroupOptions::lost_ranks).
  bool unmarked_all_gone(const std::vector<int>& ranks, const std::vector<bool>& marked) const;

  GroupOptions opts_;
  std::string prefix_;
  std::string store_url_;
  std::string store_password_;  // for mark_failed's own connection
  std::chrono::steady_clock::time_point rendezvous_deadline_{};  // the whole rendezvous's bound
  std::vector<std::shared_ptr<gloo::Context>> contexts_;
  std::vector<float> scratch_;
  uint32_t tag_ = 1;
  std::vector<uint64_t> sent_to_, received_from_;  // [size()] point-to-point messages per peer
  std::atomic<bool> broken_{false};
  mutable std::mutex stats_mu_;
  CommStats stats_;
};

// While a collective waits: a thread that asks the group's lost_ranks every kLivenessPoll and,
// the first time a member is named, calls on_lost with the names ("island 2 rank 0") and ends.
// on_lost must make the guarded waits return (abortWaitRecv/abortWaitSend) and may run while
// they do. No thread without lost_ranks or with one member. stop() (or the destructor) ends the
// watch; fired() says afterwards whether on_lost ran.
class LivenessWatch {
 public:
  LivenessWatch(const ProcessGroup& group, std::function<void(const std::string& lost)> on_lost);
  ~LivenessWatch();
  LivenessWatch(const LivenessWatch&) = delete;
  LivenessWatch& operator=(const LivenessWatch&) = delete;
  void stop();
  bool fired() const { return !lost_.empty(); }  // after stop()
  const std::string& lost() const { return lost_; }

 private:
  void watch();
  const ProcessGroup& group_;
  std::function<void(const std::string&)> on_lost_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string lost_;  // written by the thread before it ends
  std::thread thread_;
};

// The PeerLost of a wait given up on a member known gone: "<lost> gone (no heartbeat for
// fault.heartbeat_ttl_s) while the <what> waited; not waited for".
PeerLost gone_while_waiting(const std::string& lost, const std::string& what);

// Part `part` of [0, n) cut into `parts` nearly equal runs, [n·part/parts, n·(part+1)/parts),
// and every part's size (allgatherv's counts): how ranks split a buffer among themselves.
std::pair<size_t, size_t> even_part(size_t n, int part, int parts);
std::vector<size_t> even_part_sizes(size_t n, int parts);

// Runs fn(0..count-1) at once, fn(0) on the calling thread and the rest on their own threads;
// waits for all, then rethrows the first exception (by index) if any failed.
void run_parallel(int count, const std::function<void(int)>& fn);

}  // namespace atl
