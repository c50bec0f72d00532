// Process groups over Gloo (see group.h).
#include "atoll/dist/group.h"
#include "atoll/dist/listen_address.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <sstream>
#include <thread>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/timer.h"
#include "atoll/dist/seal.h"

namespace atl {

namespace {

using Ms = std::chrono::milliseconds;

std::string seconds_text(Ms d) {
  std::ostringstream s;
  s << static_cast<double>(d.count()) / 1000.0 << " s";
  return s.str();
}

void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  });
}

// Gloo reports a timed-out wait as an IoException whose text says so; any other transport
// failure (connection reset, closed by peer) means the peer is gone.
bool gloo_timed_out(const gloo::Exception& e) {
  const std::string msg = e.what();
  return msg.find("Timed out") != std::string::npos || msg.find("timeout") != std::string::npos;
}

// Inside a catch block: whether the exception in flight is a timeout.
bool timed_out_in_flight() {
  try {
    throw;
  } catch (const Timeout&) {
    return true;
  } catch (const gloo::Exception& e) {
    return gloo_timed_out(e);
  } catch (...) {
    return false;
  }
}

// `note` follows a timeout's message (who stalled).
[[noreturn]] void rethrow_translated(const std::string& context, const std::string& note = "") {
  try {
    throw;
  } catch (const Timeout& e) {
    throw Timeout(context + ": " + e.what() + note);
  } catch (const PeerLost& e) {
    throw PeerLost(context + ": " + e.what());
  } catch (const gloo::Exception& e) {
    if (gloo_timed_out(e)) throw Timeout(context + ": a peer did not answer in time (" + e.what() + ")" + note);
    throw PeerLost(context + ": lost a peer (" + e.what() + ")");
  }
}

// The longest a timed-out member waits for the others' failure marks (ProcessGroup::fail).
constexpr Ms kMarkWait(2000);

// The top byte of the slots of exchange_all's messages (Gloo's own use 0x01.., the ring 0xA7,
// reduce_scatter_sum 0xA8), of broadcast's (0xAA) and of send/recv's (0xAB).
constexpr uint64_t kExchangeSlotPrefix = 0xA9;
constexpr uint64_t kBroadcastSlotPrefix = 0xAA;
constexpr uint64_t kDirectSlotPrefix = 0xAB;

// PeerLost for waits a LivenessWatch aborted.
[[noreturn]] void throw_gone(const LivenessWatch& watch, const std::string& what) { throw gone_while_waiting(watch.lost(), what); }

// One phase of exchange_all on slot `slot`: bytes [0, send_n) of `out` go to every other rank,
// rank r's n[r] bytes arrive at off[r] of `in`; every wait ends by `deadline` or when a member is
// known gone (PeerLost).
void exchange_phase(const ProcessGroup& g, gloo::transport::UnboundBuffer& out, size_t send_n,
                    gloo::transport::UnboundBuffer& in, const std::vector<size_t>& off, const std::vector<size_t>& n,
                    uint64_t slot, std::chrono::steady_clock::time_point deadline) {
  LivenessWatch watch(g, [&](const std::string&) { in.abortWaitRecv(), out.abortWaitSend(); });
  int recvs = 0, sends = 0;
  for (int r = 0; r < g.size(); ++r) {
    if (r == g.rank()) continue;
    if (n[size_t(r)] > 0) in.recv(r, slot, off[size_t(r)], n[size_t(r)]), ++recvs;
    if (send_n > 0) out.send(r, slot, 0, send_n), ++sends;
  }
  auto left = [&] { return std::max(Ms(1), std::chrono::duration_cast<Ms>(deadline - std::chrono::steady_clock::now())); };
  for (int i = 0; i < recvs; ++i)
    if (!in.waitRecv(left())) watch.stop(), throw_gone(watch, "exchange");
  for (int i = 0; i < sends; ++i)
    if (!out.waitSend(left())) watch.stop(), throw_gone(watch, "exchange");
}

// Every rank's `mine`, in rank order, each rank sending its own to every other directly: the
// sizes (8 bytes) first, then the blobs; 2 (P-1) messages per rank and phase. For the few bytes
// of a barrier or an allgather, on the group's own unbound buffers, whose waits (unlike those of
// Gloo's collectives) a LivenessWatch can abort.
// With a sealer (the outer group) each blob travels sealed, bound to its sender and the tag.
std::vector<std::string> exchange_all(ProcessGroup& g, const std::string& plain) {
  const int P = g.size(), me = g.rank();
  const auto& ctx = g.context(0);
  const uint64_t tag = g.next_tag() & 0xffffff;
  const Sealer* sealer = g.sealer();
  auto frame = [&](int sender) {
    return FrameContext{.group = g.prefix(), .purpose = SealPurpose::kExchange, .sender = sender, .round = tag};
  };
  std::string mine = plain;
  if (sealer) {
    mine.resize(plain.size() + kSealOverhead);
    sealer->seal(reinterpret_cast<const uint8_t*>(plain.data()), plain.size(), frame(me),
                 reinterpret_cast<uint8_t*>(mine.data()));
  }
  auto slot = [&](uint64_t phase) { return (kExchangeSlotPrefix << 56) | (tag << 32) | phase; };
  const auto deadline = std::chrono::steady_clock::now() + g.timeout();
  const size_t np = static_cast<size_t>(P);
  std::vector<uint64_t> sizes(np, 0);
  uint64_t my_size = mine.size();
  std::vector<size_t> off(np), n(np, sizeof(uint64_t));
  for (int r = 0; r < P; ++r) off[size_t(r)] = size_t(r) * sizeof(uint64_t);
  n[size_t(me)] = 0;
  {
    auto out = ctx->createUnboundBuffer(&my_size, sizeof my_size);
    auto in = ctx->createUnboundBuffer(sizes.data(), sizes.size() * sizeof(uint64_t));
    exchange_phase(g, *out, sizeof my_size, *in, off, n, slot(0), deadline);
  }
  sizes[size_t(me)] = 0;
  size_t total = 0;
  for (int r = 0; r < P; ++r) off[size_t(r)] = total, n[size_t(r)] = size_t(sizes[size_t(r)]), total += n[size_t(r)];
  std::string all(total, '\0');
  if (total > 0 || !mine.empty()) {
    char none = 0;  // Gloo wants a buffer even where nothing is sent or received
    auto out = ctx->createUnboundBuffer(mine.empty() ? &none : const_cast<char*>(mine.data()), std::max<size_t>(mine.size(), 1));
    auto in = ctx->createUnboundBuffer(total ? all.data() : &none, std::max<size_t>(total, 1));
    exchange_phase(g, *out, mine.size(), *in, off, n, slot(1), deadline);
  }
  std::vector<std::string> blobs(np);
  for (int r = 0; r < P; ++r) {
    if (r == me) {
      blobs[size_t(r)] = plain;
    } else if (!sealer) {
      blobs[size_t(r)] = all.substr(off[size_t(r)], n[size_t(r)]);
    } else {
      const auto* f = reinterpret_cast<const uint8_t*>(all.data()) + off[size_t(r)];
      std::string& b = blobs[size_t(r)];
      b.resize(n[size_t(r)] >= kSealOverhead ? n[size_t(r)] - kSealOverhead : 0);
      b.resize(sealer->open(f, n[size_t(r)], frame(r), reinterpret_cast<uint8_t*>(b.data()), g.member(r)));
    }
  }
  return blobs;
}

// Gloo's view of the store while it connects the full mesh: every wait ends by the rendezvous's
// deadline (Gloo would wait the timeout once per peer), in slices between which `check` throws
// when a member it waits for is known gone.
class SlicedStore final : public gloo::rendezvous::Store {
 public:
  SlicedStore(gloo::rendezvous::Store& inner, std::chrono::steady_clock::time_point deadline,
              std::function<void()> check)
      : inner_(inner), deadline_(deadline), check_(std::move(check)) {}

  void set(const std::string& key, const std::vector<char>& data) override { inner_.set(key, data); }
  std::vector<char> get(const std::string& key) override {
    wait({key});
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, Ms(0)); }
  // `timeout` 0: until the deadline.
  void wait(const std::vector<std::string>& keys, const Ms& timeout) override {
    const auto start = std::chrono::steady_clock::now();
    const auto end = timeout.count() > 0 ? std::min(deadline_, start + timeout) : deadline_;
    for (;;) {
      const auto left = std::chrono::duration_cast<Ms>(end - std::chrono::steady_clock::now());
      try {
        inner_.wait(keys, std::clamp(left, Ms(1), kLivenessPoll));
        return;
      } catch (const Timeout& e) {
        if (std::chrono::steady_clock::now() >= end)
          throw Timeout("waited " + seconds_text(std::chrono::duration_cast<Ms>(end - start)) + " (" + e.what() + ")");
      }
      check_();
    }
  }

 private:
  gloo::rendezvous::Store& inner_;
  std::chrono::steady_clock::time_point deadline_;
  std::function<void()> check_;
};

void sum_floats(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<float*>(out);
  auto* x = static_cast<const float*>(a);
  auto* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

void max_floats(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<float*>(out);
  auto* x = static_cast<const float*>(a);
  auto* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = std::max(x[i], y[i]);
}

}  // namespace

void run_parallel(int count, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(std::max(count, 1));
  std::vector<std::thread> threads;
  for (int i = 1; i < count; ++i)
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  try {
    if (count > 0) fn(0);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

ProcessGroup::ProcessGroup(Store& store, const GroupOptions& opts)
    : opts_(opts), prefix_(store.group_prefix(opts.name, opts.epoch)), store_url_(store.url()),
      store_password_(store.address().password), sent_to_(size_t(std::max(opts.size, 1)), 0),
      received_from_(sent_to_) {
  ATOLL_CHECK(opts_.size >= 1 && opts_.rank >= 0 && opts_.rank < opts_.size)
      << "rank " << opts_.rank << " of " << opts_.size;
  ATOLL_CHECK_GE(opts_.connections, 1);
  ATOLL_CHECK_GE(opts_.bucket_bytes, sizeof(float));
  ignore_sigpipe_once();
  rendezvous_deadline_ = std::chrono::steady_clock::now() + std::min(opts_.timeout, store.timeout());
  if (opts_.hostname.empty() && opts_.iface.empty()) opts_.hostname = choose_listen_address(store_url_).address;
  // Each rank announces itself first, so a rendezvous that times out can name who never came.
  if (!store.set_if_absent(prefix_ + "/arrived/" + std::to_string(opts_.rank), opts_.hostname))
    throw ConfigError(describe() + ": this rank already joined (store " + store_url_ + ", prefix " + prefix_ +
                      "); fix: give every process its own rank, and every new group a new epoch or run id");
  store.set(prefix_ + "/size/" + std::to_string(opts_.rank), std::to_string(opts_.size));
  await_sizes(store);
  if (opts_.size == 1) return;  // nothing to connect: collectives are local
  for (int c = 0; c < opts_.connections; ++c) connect(store, c);
}

ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::connect(Store& store, int connection) {
  gloo::transport::tcp::attr attr;
  if (!opts_.iface.empty())
    attr.iface = opts_.iface;
  else
    attr.hostname = opts_.hostname;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw ConfigError(describe() + ": cannot listen on " +
                      (opts_.iface.empty() ? "host '" + opts_.hostname : "interface '" + opts_.iface) +
                      "': " + e.what());
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(opts_.rank, opts_.size);
  // Gloo's pair connect cannot be interrupted, and waits the context's timeout for a member
  // killed after it published its address (refused, or never connecting back). With lost_ranks
  // the connects get a quarter of the timeout (at least 1 s; a live member's takes milliseconds),
  // and a member known gone by then is named; the collectives pass the whole timeout themselves.
  context->setTimeout(watches_liveness() ? std::min(opts_.timeout, std::max(Ms(1000), opts_.timeout / 4)) : opts_.timeout);
  auto prefixed = store.gloo_view(prefix_ + "/c" + std::to_string(connection));
  SlicedStore view(*prefixed, rendezvous_deadline_, [&] { check_lost("waiting for the peers' addresses"); });
  try {
    context->connectFullMesh(view, device);
    context->setTimeout(opts_.timeout);
  } catch (...) {
    std::vector<bool> checked(size_t(opts_.size), false);
    checked[size_t(opts_.rank)] = true;
    check_sizes(store, checked);  // a peer of another size that came late (whatever Gloo made of it)
    connect_failed(store, connection);
  }
  contexts_.push_back(std::move(context));
}

void ProcessGroup::connect_failed(Store& store, int connection) const {
  const std::string during = describe() + ": rendezvous of connection " + std::to_string(connection);
  try {
    throw;
  } catch (const PeerLost&) {
    rethrow_translated(during);  // the store's waits named the member gone
  } catch (const Timeout& e) {
    check_lost(during);
    throw_if_missing(store);
    throw Timeout(describe() + ": all ranks arrived but connection " + std::to_string(connection) +
                  " was not set up within " + seconds_text(std::min(opts_.timeout, store.timeout())) + " (" +
                  e.what() + ")");
  } catch (...) {
    check_lost(during);  // a connect that failed on a member known gone (Gloo's connect timeout)
    rethrow_translated(during);
  }
}

void ProcessGroup::throw_if_missing(Store& store) const {
  std::vector<std::string> keys;
  for (int r = 0; r < opts_.size; ++r) keys.push_back(prefix_ + "/arrived/" + std::to_string(r));
  const std::vector<bool> here = store.exists(keys);
  std::string missing;
  for (int r = 0; r < opts_.size; ++r)
    if (!here[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  if (!missing.empty())
    throw Timeout(describe() + ": rank(s) " + missing + " of " + std::to_string(opts_.size) + " did not arrive within " +
                  seconds_text(std::min(opts_.timeout, store.timeout())) + " (store " + store_url_ + ", prefix " +
                  prefix_ + "); fix: start every rank with the same --store and run id, or raise the timeout");
}

void ProcessGroup::await_sizes(Store& store) const {
  std::vector<bool> checked(size_t(opts_.size), false);
  checked[size_t(opts_.rank)] = true;
  auto next_check = std::chrono::steady_clock::now() + kLivenessPoll;
  for (Ms pause(1); !check_sizes(store, checked); pause = std::min(pause * 2, Ms(10))) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= rendezvous_deadline_) {
      // No time is left to connect: a rank that never came is named here, so that ranks which
      // arrived at different times all end alike (not one in a connect to a peer that gave up).
      throw_if_missing(store);
      return;  // all arrived, some size not yet stated: the connect says what went wrong
    }
    if (now >= next_check) {
      check_lost(describe() + ": rendezvous (prefix " + prefix_ + ")");
      next_check = now + kLivenessPoll;
    }
    std::this_thread::sleep_for(pause);
  }
}

std::string ProcessGroup::lost_members() const {
  std::string lost;
  if (opts_.lost_ranks)
    for (int r : opts_.lost_ranks())
      if (r != opts_.rank) lost += (lost.empty() ? "" : ", ") + member(r);
  return lost;
}

void ProcessGroup::check_lost(const std::string& during) const {
  if (const std::string lost = lost_members(); !lost.empty())
    throw PeerLost(during + ": " + lost + " gone (no heartbeat for fault.heartbeat_ttl_s) before the group formed; not waited for: " +
                   "the survivors form the next epoch without it");
}

bool ProcessGroup::check_sizes(Store& store, std::vector<bool>& checked) const {
  // Ranks beyond this one's size are not looked at: such a rank finds this one's size itself.
  std::vector<std::string> keys;
  for (int r = 0; r < opts_.size; ++r) keys.push_back(prefix_ + "/size/" + std::to_string(r));
  const std::vector<bool> stated_any = store.exists(keys);
  bool all = true;
  for (int r = 0; r < opts_.size; ++r) {
    if (checked[size_t(r)]) continue;
    if (!stated_any[size_t(r)]) {
      all = false;
      continue;
    }
    checked[size_t(r)] = true;
    const std::optional<std::string> stated = store.get(keys[size_t(r)]);
    if (!stated || *stated == std::to_string(opts_.size)) continue;
    const int peer_size = std::stoi(*stated);
    const bool peer_first = r > opts_.rank;  // the higher rank first, the same sentence on both sides
    const int first = peer_first ? r : opts_.rank, first_size = peer_first ? peer_size : opts_.size;
    const int second = peer_first ? opts_.rank : r, second_size = peer_first ? opts_.size : peer_size;
    throw GroupSizeMismatch(describe() + ": " + member(first) + " was started with a group of " +
                                std::to_string(first_size) + ", " + member(second) + " with a group of " +
                                std::to_string(second_size) +
                                " (store " + store_url_ + ", prefix " + prefix_ +
                                "); fix: start every member of the group with the same size",
                            opts_.rank, opts_.size, r, peer_size);
  }
  return all;
}

std::string ProcessGroup::member(int rank) const {
  return opts_.member_name ? opts_.member_name(rank) : "rank " + std::to_string(rank);
}

std::string ProcessGroup::mark_failed(Ms wait) const {
  if (size() == 1) return "";
  try {
    // Its own connection: the group keeps none to the store after rendezvous.
    Store store(StoreOptions{
        .url = store_url_, .password = store_password_, .run_id = "census", .timeout = std::max(wait, Ms(1000))});
    store.set(prefix_ + "/failed/" + std::to_string(rank()), "1");
    if (wait.count() == 0) return "";
    std::vector<std::string> keys;
    std::vector<int> ranks;
    for (int r = 0; r < size(); ++r)
      if (r != rank()) keys.push_back(prefix_ + "/failed/" + std::to_string(r)), ranks.push_back(r);
    // In slices, so that the wait ends once every member still unmarked is known gone.
    const auto end = std::chrono::steady_clock::now() + wait;
    std::vector<bool> marked = store.exists(keys);
    while (std::find(marked.begin(), marked.end(), false) != marked.end() &&
           std::chrono::steady_clock::now() < end && !unmarked_all_gone(ranks, marked)) {
      try {
        const auto left = std::chrono::duration_cast<Ms>(end - std::chrono::steady_clock::now());
        store.wait(keys, std::clamp(left, Ms(1), kLivenessPoll));
      } catch (const Timeout&) {
        // those still unmarked stalled, unless they mark in the next slice
      }
      marked = store.exists(keys);
    }
    std::string stalled;
    for (size_t i = 0; i < keys.size(); ++i)
      if (!marked[i]) stalled += (stalled.empty() ? "" : ", ") + member(ranks[i]);
    if (stalled.empty()) return "; every member gave up waiting (none stalled alone: do all call the same collectives?)";
    return "; stalled: " + stalled + (size() > 2 ? " (every other member gave up waiting too)" : "") +
           "; fix: see why " + stalled + " stopped answering (its output: a crash, a stopped or swapping process, "
           "a lost link), or raise the timeout (fault.timeout_s in a run) if it is only slow";
  } catch (const std::exception&) {
    return "";  // the store is unreachable too: nothing more to say
  }
}

bool ProcessGroup::unmarked_all_gone(const std::vector<int>& ranks, const std::vector<bool>& marked) const {
  if (!opts_.lost_ranks) return false;
  const std::vector<int> lost = opts_.lost_ranks();
  for (size_t i = 0; i < ranks.size(); ++i)
    if (!marked[i] && std::find(lost.begin(), lost.end(), ranks[i]) == lost.end()) return false;
  return true;
}

std::string ProcessGroup::describe() const {
  return "group '" + opts_.name + "' epoch " + std::to_string(opts_.epoch) + ", rank " + std::to_string(opts_.rank) +
         " of " + std::to_string(opts_.size);
}

const std::shared_ptr<gloo::Context>& ProcessGroup::context(int connection) const {
  ATOLL_CHECK(connection >= 0 && connection < static_cast<int>(contexts_.size()))
      << "connection " << connection << " of " << contexts_.size() << " (" << describe() << ")";
  return contexts_[connection];
}

void ProcessGroup::record(uint64_t bytes_sent, double seconds) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.bytes_sent += bytes_sent;
  stats_.seconds += seconds;
  stats_.ops += 1;
}

CommStats ProcessGroup::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void ProcessGroup::check_usable(const char* op) const {
  if (broken_)
    throw PeerLost(describe() + ": " + op + " on a group broken by an earlier failure; fix: form a new group " +
                   "with the next membership epoch");
}

void ProcessGroup::fail(const std::string& op, Ms waited) {
  broken_ = true;
  // Every member whose collective fails says so in the store (a timed-out member may close its
  // connections, so its neighbours see a lost peer rather than a timeout of their own). A member
  // that timed out then waits for the others' marks: those that never mark stalled. Members that
  // gave up on the same stall time out within moments of each other (they waited on chained
  // messages), so half its wait, at most kMarkWait, names who stalled; the wait only names, and
  // every second of it delays the re-form. A lost peer is reported at once.
  const bool timed_out = timed_out_in_flight();
  const Ms spent = waited.count() > 0 ? waited : opts_.timeout;
  const std::string note = mark_failed(timed_out ? std::min(spent / 2, kMarkWait) : Ms(0));
  rethrow_translated(describe() + ": " + op, note);
}

PeerLost gone_while_waiting(const std::string& lost, const std::string& what) {
  return PeerLost(lost + " gone (no heartbeat for fault.heartbeat_ttl_s) while the " + what + " waited; not waited for");
}

LivenessWatch::LivenessWatch(const ProcessGroup& group, std::function<void(const std::string&)> on_lost)
    : group_(group), on_lost_(std::move(on_lost)) {
  if (group_.size() > 1 && group_.watches_liveness()) thread_ = std::thread([this] { watch(); });
}

LivenessWatch::~LivenessWatch() { stop(); }

void LivenessWatch::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void LivenessWatch::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, kLivenessPoll, [this] { return done_; })) {
    std::string lost;
    try {
      lost = group_.lost_members();
    } catch (const std::exception&) {
      continue;  // the store is unreachable: the timeout still bounds the wait
    }
    if (lost.empty()) continue;
    lost_ = lost;
    on_lost_(lost_);
    return;
  }
}

void ProcessGroup::barrier() {
  check_usable("barrier");
  if (size() == 1) return;
  const double t0 = now_s();
  try {
    exchange_all(*this, std::string());  // no rank's sizes arrive before every rank is here
  } catch (...) {
    fail("barrier");
  }
  record(sizeof(uint64_t) * size_t(size() - 1), now_s() - t0);
}

void ProcessGroup::broadcast(void* data, size_t bytes, int root) {
  check_usable("broadcast");
  ATOLL_CHECK(root >= 0 && root < size()) << "broadcast root " << root << " (" << describe() << ")";
  if (size() == 1 || bytes == 0) return;
  const double t0 = now_s();
  const bool is_root = rank() == root;
  const Sealer* sealer = opts_.sealer.get();
  const size_t wire = sealer ? bytes + kSealOverhead : bytes;
  std::vector<uint8_t> copy(is_root && !sealer ? 0 : wire);
  const uint64_t tag = next_tag() & 0xffffff;
  const uint64_t slot = (kBroadcastSlotPrefix << 56) | (tag << 32);
  const FrameContext frame{.group = prefix_, .purpose = SealPurpose::kBroadcast, .sender = root, .round = tag};
  if (is_root && sealer) sealer->seal(static_cast<const uint8_t*>(data), bytes, frame, copy.data());
  try {
    auto ub = contexts_[0]->createUnboundBuffer(is_root && !sealer ? data : copy.data(), wire);
    LivenessWatch watch(*this, [&](const std::string&) { ub->abortWaitRecv(), ub->abortWaitSend(); });
    if (is_root) {
      for (int r = 0; r < size(); ++r)
        if (r != root) ub->send(r, slot);
      for (int r = 1; r < size(); ++r)
        if (!ub->waitSend(opts_.timeout)) watch.stop(), throw_gone(watch, "broadcast");
    } else {
      ub->recv(root, slot);
      if (!ub->waitRecv(opts_.timeout)) watch.stop(), throw_gone(watch, "broadcast");
    }
    if (!is_root && sealer) {  // opened in place of the copy's plaintext, so a failure leaves data as it was
      std::vector<uint8_t> plain(bytes);
      sealer->open(copy.data(), wire, frame, plain.data(), member(root));
      copy.swap(plain);
    }
  } catch (...) {
    fail("broadcast");
  }
  if (!is_root) std::memcpy(data, copy.data(), bytes);
  record(is_root ? wire * (size() - 1) : 0, now_s() - t0);
}

void ProcessGroup::send(const void* data, size_t bytes, int dst) {
  direct(const_cast<void*>(data), bytes, dst, true);
}

void ProcessGroup::recv(void* data, size_t bytes, int src) { direct(data, bytes, src, false); }

// One message to (sending) or from `peer`, matched by the pair's count of messages that way.
void ProcessGroup::direct(void* data, size_t bytes, int peer, bool sending) {
  const char* op = sending ? "send" : "recv";
  check_usable(op);
  ATOLL_CHECK(peer >= 0 && peer < size() && peer != rank()) << op << " with rank " << peer << " (" << describe() << ")";
  if (bytes == 0) return;
  const double t0 = now_s();
  uint64_t& count = (sending ? sent_to_ : received_from_)[size_t(peer)];
  const uint64_t index = count++ & 0xffffffffffffULL;
  const uint64_t slot = (kDirectSlotPrefix << 56) | index;
  const std::string what = std::string(sending ? "send to " : "receive from ") + member(peer);
  // Sealed: the frame is bound to the pair (sender, receiver) and the pair's message count.
  const Sealer* sealer = opts_.sealer.get();
  const size_t wire = sealer ? bytes + kSealOverhead : bytes;
  const FrameContext frame{.group = prefix_, .purpose = SealPurpose::kDirect, .sender = sending ? rank() : peer,
                           .receiver = sending ? peer : rank(), .round = index};
  std::vector<uint8_t> sealed(sealer ? wire : 0);
  if (sealer && sending) sealer->seal(static_cast<const uint8_t*>(data), bytes, frame, sealed.data());
  try {
    auto ub = contexts_[0]->createUnboundBuffer(sealer ? sealed.data() : data, wire);
    LivenessWatch watch(*this, [&](const std::string&) { sending ? ub->abortWaitSend() : ub->abortWaitRecv(); });
    sending ? ub->send(peer, slot) : ub->recv(peer, slot);
    if (!(sending ? ub->waitSend(opts_.timeout) : ub->waitRecv(opts_.timeout))) watch.stop(), throw_gone(watch, what);
    if (sealer && !sending) sealer->open(sealed.data(), wire, frame, static_cast<uint8_t*>(data), member(peer));
  } catch (...) {
    fail(std::string(op) + " of " + std::to_string(bytes) + " bytes (" + what + ")");
  }
  record(sending ? wire : 0, now_s() - t0);
}

// A ring step's send and receive in flight at once, on the same slots as direct()'s messages
// (the pair's counts), so they interleave with send/recv in order. wait() waits for both with
// the group's timeout, giving up on a member known gone.
class ProcessGroup::DirectExchange final : public Collective::Pending {
 public:
  DirectExchange(ProcessGroup& g, const void* sdata, size_t sbytes, int dst, void* rdata, size_t rbytes, int src)
      : g_(g), dst_(dst), src_(src), sbytes_(sbytes), rbytes_(rbytes), t0_(now_s()) {
    g.check_usable("exchange");
    ATOLL_CHECK(!g.sealer()) << "exchange() on a sealed group (" << g.describe() << "): not sealed; use send and recv";
    ATOLL_CHECK(dst >= 0 && dst < g.size() && dst != g.rank() && src >= 0 && src < g.size() && src != g.rank())
        << "exchange with ranks " << dst << " and " << src << " (" << g.describe() << ")";
    try {
      if (rbytes > 0) {
        in_ = g.contexts_[0]->createUnboundBuffer(rdata, rbytes);
        in_->recv(src, slot(g.received_from_, src));
      }
      if (sbytes > 0) {
        out_ = g.contexts_[0]->createUnboundBuffer(const_cast<void*>(sdata), sbytes);
        out_->send(dst, slot(g.sent_to_, dst));
      }
    } catch (...) {
      g.fail("exchange (" + what() + ")");
    }
  }
  ~DirectExchange() override {
    if (done_) return;
    try {
      wait();
    } catch (...) {  // the caller is unwinding already
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    try {
      LivenessWatch watch(g_, [&](const std::string&) {
        if (in_) in_->abortWaitRecv();
        if (out_) out_->abortWaitSend();
      });
      if (in_ && !in_->waitRecv(g_.opts_.timeout)) watch.stop(), throw_gone(watch, what());
      if (out_ && !out_->waitSend(g_.opts_.timeout)) watch.stop(), throw_gone(watch, what());
    } catch (...) {
      g_.fail("exchange of " + std::to_string(sbytes_) + " and " + std::to_string(rbytes_) + " bytes (" + what() + ")");
    }
    g_.record(sbytes_, now_s() - t0_);
  }

 private:
  static uint64_t slot(std::vector<uint64_t>& counts, int peer) {
    return (kDirectSlotPrefix << 56) | (counts[size_t(peer)]++ & 0xffffffffffffULL);
  }
  std::string what() const { return "send to " + g_.member(dst_) + ", receive from " + g_.member(src_); }
  ProcessGroup& g_;
  int dst_, src_;
  size_t sbytes_, rbytes_;
  double t0_;
  bool done_ = false;
  std::unique_ptr<gloo::transport::UnboundBuffer> in_, out_;
};

std::unique_ptr<Collective::Pending> ProcessGroup::exchange(const void* send_data, size_t send_bytes, int dst,
                                                            void* recv_data, size_t recv_bytes, int src) {
  return std::make_unique<DirectExchange>(*this, send_data, send_bytes, dst, recv_data, recv_bytes, src);
}

std::vector<std::string> ProcessGroup::allgather(const std::string& blob) {
  check_usable("allgather");
  if (size() == 1) return {blob};
  const double t0 = now_s();
  std::vector<std::string> out;
  try {
    out = exchange_all(*this, blob);
  } catch (...) {
    fail("allgather");
  }
  record((sizeof(uint64_t) + blob.size() + (sealer() ? kSealOverhead : 0)) * size_t(size() - 1), now_s() - t0);
  return out;
}

void ProcessGroup::gather(const void* data, size_t bytes, void* out, int root) {
  check_usable("gather");
  ATOLL_CHECK(root >= 0 && root < size()) << "gather root " << root << " (" << describe() << ")";
  ATOLL_CHECK(rank() != root || out != nullptr || bytes == 0) << "gather: the root needs an output";
  if (bytes == 0) return;
  if (size() == 1) {
    std::memcpy(out, data, bytes);
    return;
  }
  const double t0 = now_s();
  try {
    gloo::GatherOptions o(contexts_[0]);
    o.setInput(static_cast<uint8_t*>(const_cast<void*>(data)), bytes);
    if (rank() == root) o.setOutput(static_cast<uint8_t*>(out), bytes * size_t(size()));
    o.setRoot(root);
    o.setTag(next_tag());
    o.setTimeout(opts_.timeout);
    gloo::gather(o);
  } catch (...) {
    fail("gather");
  }
  record(rank() == root ? 0 : bytes, now_s() - t0);
}

std::pair<size_t, size_t> even_part(size_t n, int part, int parts) {
  return {n * size_t(part) / size_t(parts), n * size_t(part + 1) / size_t(parts)};
}

std::vector<size_t> even_part_sizes(size_t n, int parts) {
  std::vector<size_t> sizes(static_cast<size_t>(parts));
  for (int p = 0; p < parts; ++p) {
    const auto [lo, hi] = even_part(n, p, parts);
    sizes[size_t(p)] = hi - lo;
  }
  return sizes;
}

void ProcessGroup::allgatherv(float* data, const std::vector<size_t>& counts) {
  check_usable("allgatherv");
  ATOLL_CHECK_EQ(counts.size(), size_t(size()));
  size_t total = 0;
  for (size_t c : counts) total += c;
  if (size() == 1 || total == 0) return;
  const double t0 = now_s();
  try {
    gloo::AllgathervOptions o(contexts_[0]);
    o.setOutput(data, counts);  // no input: in place, rank r's part already at its offset
    o.setTag(next_tag());
    o.setTimeout(opts_.timeout);
    gloo::allgatherv(o);
  } catch (...) {
    fail("allgatherv of " + std::to_string(total) + " floats");
  }
  // Gloo's ring forwards every part but the one that reaches us last: (P-1) parts per rank.
  record((total - counts[size_t((rank() + 1) % size())]) * sizeof(float), now_s() - t0);
}

void ProcessGroup::reduce_scatter_sum(float* data, const std::vector<size_t>& counts) {
  check_usable("reduce_scatter_sum");
  ATOLL_CHECK_EQ(counts.size(), size_t(size()));
  const int P = size(), r = rank();
  if (P == 1) return;
  std::vector<size_t> offs(P + 1, 0);
  for (int i = 0; i < P; ++i) offs[i + 1] = offs[i] + counts[i];
  const size_t most = *std::max_element(counts.begin(), counts.end());
  if (most == 0) return;
  const double t0 = now_s();
  // Two staging parts: what goes right and what comes from the left. `data` is read only, and
  // written once at the end, so a failure leaves it unchanged.
  std::vector<float> out(most), in(most);
  constexpr uint64_t kSlotPrefix = 0xA8;  // top byte of its slots; Gloo's own use 0x01.., the ring 0xA7
  const uint64_t tag = next_tag() & 0xffffff;
  const int right = (r + 1) % P, left = (r + P - 1) % P;
  uint64_t sent = 0;
  try {
    const auto& ctx = contexts_[0];
    auto out_ub = ctx->createUnboundBuffer(out.data(), most * sizeof(float));
    auto in_ub = ctx->createUnboundBuffer(in.data(), most * sizeof(float));
    LivenessWatch watch(*this, [&](const std::string&) { in_ub->abortWaitRecv(), out_ub->abortWaitSend(); });
    auto aborted = [&] { watch.stop(), throw_gone(watch, "reduce-scatter"); };
    // At step s rank r sends its partial sum of part (r-s-1) and receives the left's of part
    // (r-s-2), adding its own: after P-1 steps the part received is its own, summed by all.
    const int first = (r + P - 1) % P;
    std::copy(data + offs[first], data + offs[first + 1], out.begin());
    for (int s = 0; s < P - 1; ++s) {
      const int ks = (r + 2 * P - s - 1) % P, kr = (r + 2 * P - s - 2) % P;
      const uint64_t slot = (kSlotPrefix << 56) | (tag << 32) | uint64_t(s);
      if (counts[kr]) in_ub->recv(left, slot, 0, counts[kr] * sizeof(float));
      if (counts[ks]) out_ub->send(right, slot, 0, counts[ks] * sizeof(float));
      if (counts[kr] && !in_ub->waitRecv(opts_.timeout)) aborted();
      if (counts[ks] && !out_ub->waitSend(opts_.timeout)) aborted();
      sent += counts[ks] * sizeof(float);
      const float* own = data + offs[kr];
      for (size_t i = 0; i < counts[kr]; ++i) in[i] += own[i];  // the left's partial + this rank's
      if (s < P - 2) std::copy(in.begin(), in.begin() + counts[kr], out.begin());
    }
  } catch (...) {
    fail("reduce_scatter_sum of " + std::to_string(offs[P]) + " floats");
  }
  std::copy(in.begin(), in.begin() + counts[r], data + offs[r]);
  record(sent, now_s() - t0);
}

void ProcessGroup::expect_same(const std::string& what, const std::string& value) {
  const std::vector<std::string> all = allgather(value);
  for (int r = 1; r < size(); ++r) {
    if (all[r] == all[0]) continue;
    const auto& a = all[0];
    const auto& b = all[r];
    size_t at = 0;
    while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
    const size_t from = at > 20 ? at - 20 : 0;
    throw ConfigError(describe() + ": rank " + std::to_string(r) + "'s " + what + " differs from rank 0's at byte " +
                      std::to_string(at) + ": '" + b.substr(from, 40) + "' vs '" + a.substr(from, 40) + "'");
  }
}

void ProcessGroup::allreduce_sum(float* data, size_t n) { allreduce(data, n, "allreduce_sum", &sum_floats); }

void ProcessGroup::allreduce_max(float* data, size_t n) { allreduce(data, n, "allreduce_max", &max_floats); }

void ProcessGroup::allreduce(float* data, size_t n, const char* op, ReduceFn fn) {
  check_usable(op);
  if (size() == 1 || n == 0) return;
  const double t0 = now_s();
  scratch_.resize(n);
  const size_t bucket = std::max<size_t>(1, opts_.bucket_bytes / sizeof(float));
  const size_t buckets = (n + bucket - 1) / bucket;
  const int streams = static_cast<int>(std::min<size_t>(contexts_.size(), buckets));
  const uint32_t tag = next_tag();
  try {
    run_parallel(streams, [&](int c) {
      for (size_t b = c; b < buckets; b += streams) {
        const size_t off = b * bucket, len = std::min(bucket, n - off);
        gloo::AllreduceOptions o(contexts_[c]);
        o.setInput(data + off, len);
        o.setOutput(scratch_.data() + off, len);
        o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        o.setReduceFunction(fn);
        o.setTag(tag);
        o.setTimeout(opts_.timeout);
        gloo::allreduce(o);
      }
    });
  } catch (...) {
    fail(std::string(op) + " of " + std::to_string(n) + " floats");
  }
  std::memcpy(data, scratch_.data(), n * sizeof(float));
  record(2 * (size() - 1) * n * sizeof(float) / size(), now_s() - t0);
}

}  // namespace atl
