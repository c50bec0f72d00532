// Sealed traffic (dist/seal.h). Frames: a round trip; one flipped bit anywhere in the frame (size,
// nonce, ciphertext, tag) or any other field of its context (group, purpose, sender, receiver,
// round, message) refused; another run's key refused. Records: a MAC that binds the key; a record
// written without the key ignored by the store, and one in the way of a write-once replaced. With
// real processes: the sealed ring gives the unsealed ring's bits; a loopback capture (root: a raw
// packet socket on lo) finds a known plaintext on the wire unsealed and not sealed; a ring message
// altered after sealing (ATOLL_FAULT corrupt) is dropped and named, the caller's buffer unchanged,
// and the next group's mean is right; the group's own collectives sealed.
#include "atoll/dist/seal.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "atoll/core/fault_injection.h"
#include "atoll/dist/group.h"
#include "atoll/dist/ring_allreduce.h"
#include "atoll/dist/store.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using testing::hash_floats;
using testing::run_processes;
using testing::test_value;

constexpr const char* kSecret = "0123456789abcdef0123456789abcdef";

FrameContext context() {
  return {.group = "atoll/r1/outer-r0/e3", .purpose = SealPurpose::kRing, .sender = 1, .receiver = 2, .round = 7, .seq = 41};
}

std::vector<uint8_t> message(size_t n) {
  std::vector<uint8_t> m(n);
  for (size_t i = 0; i < n; ++i) m[i] = uint8_t(i * 31 + 7);
  return m;
}

TEST(Seal, RoundTripsEverySizeAndAddsTheStatedOverhead) {
  const Sealer s(kSecret);
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{1000}, size_t{1} << 20}) {
    const std::vector<uint8_t> m = message(n);
    std::vector<uint8_t> frame(n + kSealOverhead), back(n + 1, 0xee);
    ASSERT_EQ(s.seal(m.data(), n, context(), frame.data()), n + kSealOverhead);
    EXPECT_EQ(Sealer::frame_size(frame.data(), frame.size()), n + kSealOverhead);
    ASSERT_EQ(s.open(frame.data(), frame.size(), context(), back.data(), "island 1 rank 0"), n) << n;
    EXPECT_EQ(std::memcmp(back.data(), m.data(), n), 0) << n;
    EXPECT_EQ(back[n], 0xee) << "wrote past the plaintext";
  }
}

TEST(Seal, TwoSealsOfOneMessageDifferAndHideIt) {
  const Sealer s(kSecret);
  const std::vector<uint8_t> m(4096, 'A');  // a plaintext anyone would spot
  std::vector<uint8_t> a(m.size() + kSealOverhead), b(m.size() + kSealOverhead);
  s.seal(m.data(), m.size(), context(), a.data());
  s.seal(m.data(), m.size(), context(), b.data());
  EXPECT_NE(a, b) << "random nonces: no two frames alike";
  const std::string text(a.begin(), a.end());
  EXPECT_EQ(text.find(std::string(16, 'A')), std::string::npos);
}

TEST(Seal, EveryFlippedBitOfTheFrameIsRefused) {
  const Sealer s(kSecret);
  const std::vector<uint8_t> m = message(37);
  std::vector<uint8_t> frame(m.size() + kSealOverhead), back(m.size());
  s.seal(m.data(), m.size(), context(), frame.data());
  // Every bit: the size (bytes 0-3), the nonce (4-27), the ciphertext, the tag (the last 16).
  for (size_t bit = 0; bit < frame.size() * 8; ++bit) {
    std::vector<uint8_t> bad = frame;
    bad[bit / 8] ^= uint8_t(1u << (bit % 8));
    EXPECT_FALSE(s.try_open(bad.data(), bad.size(), context(), back.data())) << "bit " << bit;
  }
  EXPECT_TRUE(s.try_open(frame.data(), frame.size(), context(), back.data()));
  EXPECT_FALSE(s.try_open(frame.data(), frame.size() - 1, context(), back.data())) << "cut short";
}

TEST(Seal, AFrameOpensOnlyInItsOwnContext) {
  const Sealer s(kSecret);
  const std::vector<uint8_t> m = message(64);
  std::vector<uint8_t> frame(m.size() + kSealOverhead), back(m.size());
  s.seal(m.data(), m.size(), context(), frame.data());
  std::vector<std::pair<std::string, FrameContext>> others;
  auto other = [&](const std::string& what, auto change) {
    FrameContext c = context();
    change(c);
    others.push_back({what, c});
  };
  other("another run", [](FrameContext& c) { c.group = "atoll/r2/outer-r0/e3"; });
  other("another epoch", [](FrameContext& c) { c.group = "atoll/r1/outer-r0/e4"; });
  other("another purpose", [](FrameContext& c) { c.purpose = SealPurpose::kDirect; });
  other("another sender", [](FrameContext& c) { c.sender = 0; });
  other("another receiver", [](FrameContext& c) { c.receiver = 0; });
  other("the pair reversed", [](FrameContext& c) { std::swap(c.sender, c.receiver); });
  other("another round (a replay)", [](FrameContext& c) { c.round = 8; });
  other("another message of the round", [](FrameContext& c) { c.seq = 42; });
  for (const auto& [what, c] : others) EXPECT_FALSE(s.try_open(frame.data(), frame.size(), c, back.data())) << what;
}

TEST(Seal, AnotherRunsKeyIsRefusedAndTheFailureIsReportedNamingThePeer) {
  const Sealer mine(kSecret), theirs("another run's token");
  const std::vector<uint8_t> m = message(100);
  std::vector<uint8_t> frame(m.size() + kSealOverhead), back(m.size());
  theirs.seal(m.data(), m.size(), context(), frame.data());
  std::vector<std::string> reports;
  Sealer& reporter = const_cast<Sealer&>(mine);
  reporter.set_on_forgery([&](const std::string& kind, const std::string& from, const std::string&) {
    reports.push_back(kind + " " + from);
  });
  try {
    mine.open(frame.data(), frame.size(), context(), back.data(), "island 1 rank 0");
    ADD_FAILURE() << "opened a frame of another key";
  } catch (const ForgedFrame& e) {
    EXPECT_NE(std::string(e.what()).find("island 1 rank 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("failed authentication"), std::string::npos) << e.what();
  }
  EXPECT_EQ(reports, (std::vector<std::string>{"frame island 1 rank 0"}));
}

TEST(Seal, RecordsCarryAMacBoundToTheirKey) {
  const Sealer s(kSecret), other("another run's token");
  const std::string key = "atoll/r1/members/view/e2", value = R"({"islands":[0,1]})";
  const std::string stored = s.sign_record(key, value);
  EXPECT_EQ(s.open_record(key, stored), value);
  EXPECT_EQ(s.open_record(key, value), std::nullopt) << "written without the key";
  EXPECT_EQ(s.open_record("atoll/r1/members/view/e3", stored), std::nullopt) << "moved to another key";
  EXPECT_EQ(s.open_record(key, other.sign_record(key, value)), std::nullopt) << "another run's key";
  std::string altered = stored;
  altered[2] ^= 1;
  EXPECT_EQ(s.open_record(key, altered), std::nullopt);
}

TEST(Seal, TheDoorsVerifierIsNeitherTheTokenNorAKey) {
  const std::string v = run_token_verifier(kSecret);
  EXPECT_EQ(v.size(), 64u);
  EXPECT_EQ(v, run_token_verifier(kSecret));
  EXPECT_NE(v, run_token_verifier("another token"));
  EXPECT_EQ(v.find(kSecret), std::string::npos);
}

class SealedTraffic : public testing::RedisSuite {};

// A store record written without the key (a process with the store's password but not the run's
// token): ignored where read, replaced where it stands in the way of a write-once.
TEST_F(SealedTraffic, AStoreRecordForgedWithoutTheKeyIsIgnored) {
  auto sealer = std::make_shared<Sealer>(kSecret);
  std::vector<std::string> reports;
  std::mutex mu;
  sealer->set_on_forgery([&](const std::string& kind, const std::string& from, const std::string&) {
    std::lock_guard<std::mutex> lock(mu);
    reports.push_back(kind + " " + from);
  });
  StoreOptions o = store_options("forged-record");
  Store plain(o);  // the forger
  o.records = sealer;
  Store sealed(o);
  const std::string view = sealed.run_prefix() + "/members/view/e1", hb = sealed.run_prefix() + "/members/hb/0.0";
  plain.set(view, R"({"islands":[9]})");
  EXPECT_EQ(sealed.get(view), std::nullopt);
  EXPECT_EQ(sealed.get_many({view})[0], std::nullopt);
  EXPECT_TRUE(sealed.set_if_absent(view, R"({"islands":[0,1]})")) << "the forged record is in the way";
  EXPECT_EQ(sealed.get(view), R"({"islands":[0,1]})");
  EXPECT_FALSE(sealed.set_if_absent(view, "again")) << "a genuine record stays written once";
  EXPECT_NE(plain.get(view), R"({"islands":[0,1]})") << "stored with its MAC";
  plain.set_with_ttl(hb, "forger:1:1", std::chrono::milliseconds(60000));  // a heartbeat claiming a place
  EXPECT_EQ(sealed.get_expiring(hb), std::nullopt);
  EXPECT_TRUE(sealed.set_with_ttl_if_free(hb, "me:2:2", std::chrono::milliseconds(60000)));
  EXPECT_EQ(sealed.get(hb), "me:2:2");
  const std::string unsealed = sealed.run_prefix() + "/stop";  // outside members/ and ckpt/: as it is
  sealed.set(unsealed, "12");
  EXPECT_EQ(plain.get(unsealed), "12");
  EXPECT_EQ(reports.size(), 5u);  // the view read twice and cleared, the heartbeat read and cleared
  for (const std::string& r : reports) EXPECT_EQ(r.rfind("record atoll/forged-record/members/", 0), 0u) << r;
}

// Every rank's mean of the same inputs (int8, compressed), sealed or not: the hashes of the results.
std::vector<std::string> ring_hashes(const StoreOptions& o, int size, size_t n, bool seal) {
  return run_processes(size, [&](int rank) {
    Store store(o);
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = size, .connections = 2,
                                       .sealer = seal ? std::make_shared<Sealer>(kSecret) : nullptr});
    RingAllreduce ring(g, RingOptions{.codec = Codec::kInt8, .chunk_bytes = 4096, .compress = true});
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = test_value(5, rank, i);
    ring.mean(x.data(), n);
    return std::to_string(hash_floats(x.data(), n));
  });
}

TEST_F(SealedTraffic, TheSealedRingGivesTheUnsealedRingsBits) {
  for (int size : {2, 3}) {
    const size_t n = 10007;
    const auto plain = ring_hashes(store_options("ring-plain" + std::to_string(size)), size, n, false);
    const auto sealed = ring_hashes(store_options("ring-sealed" + std::to_string(size)), size, n, true);
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(sealed[size_t(r)], plain[0]) << "size " << size << " rank " << r;
      EXPECT_EQ(plain[size_t(r)], plain[0]) << "size " << size << " rank " << r;
    }
  }
}

// Every packet on the loopback interface while `run` runs (a raw packet socket: root only).
std::string capture_loopback(const std::function<void()>& run) {
  const int fd = ::socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
  if (fd < 0) return {};
  sockaddr_ll at{};
  at.sll_family = AF_PACKET;
  at.sll_protocol = htons(ETH_P_ALL);
  at.sll_ifindex = int(::if_nametoindex("lo"));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0) {
    ::close(fd);
    return {};
  }
  std::string seen;
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    std::vector<char> buf(1 << 16);
    while (!stop && seen.size() < (size_t{256} << 20)) {  // bounded in bytes and by stop
      const ssize_t got = ::recv(fd, buf.data(), buf.size(), 0);
      if (got > 0) seen.append(buf.data(), size_t(got));
      else std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  run();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the last packets
  stop = true;
  reader.join();
  ::close(fd);
  return seen;
}

// An eavesdropper on the wire: every rank's input is one float repeated (fp32 codec, no
// compression), so the first hop's message is that float's bytes over and over. Unsealed, the
// capture finds 64 bytes of it (the oracle that the capture sees the ring); sealed, never.
TEST_F(SealedTraffic, AnEavesdropperOnTheWireFindsNoPlaintextOfTheSealedRing) {
  if (::geteuid() != 0) GTEST_SKIP() << "a raw packet socket on lo needs root";
  const float marker = 1.2345678e-3f;
  std::string pattern;
  for (int i = 0; i < 16; ++i) pattern.append(reinterpret_cast<const char*>(&marker), sizeof marker);
  for (bool seal : {false, true}) {
    const StoreOptions o = store_options(seal ? "eavesdrop-sealed" : "eavesdrop-plain");
    std::vector<std::string> out;
    const std::string wire = capture_loopback([&] {
      out = run_processes(2, [&](int rank) {
        Store store(o);
        ProcessGroup g(store, GroupOptions{.rank = rank, .size = 2,
                                           .sealer = seal ? std::make_shared<Sealer>(kSecret) : nullptr});
        RingAllreduce ring(g, RingOptions{.codec = Codec::kFp32});
        std::vector<float> x(1 << 16, marker);
        ring.mean(x.data(), x.size());
        return std::string(x[0] == marker ? "right" : "wrong");
      });
    });
    EXPECT_EQ(out, (std::vector<std::string>{"right", "right"}));
    ASSERT_FALSE(wire.empty()) << "captured nothing on lo";
    if (seal) EXPECT_EQ(wire.find(pattern), std::string::npos) << "plaintext on the wire while sealed";
    else EXPECT_NE(wire.find(pattern), std::string::npos) << "the capture did not see the ring (the oracle)";
  }
}

// A ring message altered after sealing (a tampering router, or peer): the receiver drops it and
// names the sender, nothing of it is applied (every rank's input is as before), and the next
// group's mean is the right one.
TEST_F(SealedTraffic, AnAlteredRingMessageIsDroppedNamedAndTheRetryIsRight) {
  const int size = 3;
  const size_t n = 10007;
  const auto expected = ring_hashes(store_options("tamper-reference"), size, n, false);
  const StoreOptions o = store_options("tamper");
  const auto out = run_processes(size, [&](int rank) {
    ::setenv("ATOLL_FAULT", "corrupt:island=1:outer_step=1:ring_chunk=1", 1);
    arm_fault_injection(rank, 0);
    fault_outer_step(1);
    auto sealer = std::make_shared<Sealer>(kSecret);
    std::string reported;
    sealer->set_on_forgery([&](const std::string& kind, const std::string& from, const std::string&) {
      reported += kind + " from " + from + ";";
    });
    Store store(o);
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = test_value(5, rank, i);
    const uint64_t before = hash_floats(x.data(), n);
    std::string first = "completed";
    {
      auto g = std::make_unique<ProcessGroup>(
          store, GroupOptions{.rank = rank, .size = size, .connections = 2, .timeout = std::chrono::seconds(10), .sealer = sealer});
      RingAllreduce ring(*g, RingOptions{.codec = Codec::kInt8, .chunk_bytes = 4096, .compress = true});
      try {
        ring.mean(x.data(), n);
      } catch (const PeerLost& e) {
        first = std::string("PeerLost: ") + e.what();
      }
    }  // the failed group goes (as an elastic run drops it), so peers blocked with it fail at once
    const bool unchanged = hash_floats(x.data(), n) == before;
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = size, .epoch = 1, .connections = 2, .sealer = sealer});
    RingAllreduce ring(g, RingOptions{.codec = Codec::kInt8, .chunk_bytes = 4096, .compress = true});
    ring.mean(x.data(), n);
    return first + "|" + (unchanged ? "unchanged" : "CHANGED") + "|" + reported + "|" + std::to_string(hash_floats(x.data(), n));
  }, std::chrono::seconds(60));
  for (int r = 0; r < size; ++r) {
    const std::string& got = out[size_t(r)];
    EXPECT_EQ(got.rfind("PeerLost: ", 0), 0u) << "rank " << r << ": " << got;
    EXPECT_NE(got.find("|unchanged|"), std::string::npos) << "rank " << r << ": " << got;
    EXPECT_EQ(got.substr(got.rfind('|') + 1), expected[0]) << "rank " << r << ": the retry's mean";
  }
  // Rank 1 sends to rank 2: rank 2 alone opened the altered frame, and named rank 1.
  EXPECT_NE(out[2].find("failed authentication"), std::string::npos) << out[2];
  EXPECT_NE(out[2].find("|frame from rank 1;|"), std::string::npos) << out[2];
  EXPECT_NE(out[0].find("||"), std::string::npos) << "rank 0 saw no forged frame: " << out[0];
}

// The group's own collectives sealed: barrier, allgather, broadcast, send and recv carry their
// data; a member with another run's key fails every peer's allgather, by name.
TEST_F(SealedTraffic, TheGroupsCollectivesAreSealedAndAnotherKeyIsRefused) {
  const StoreOptions o = store_options("group-sealed");
  const auto out = run_processes(3, [&](int rank) {
    Store store(o);
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = 3, .sealer = std::make_shared<Sealer>(kSecret)});
    g.barrier();
    std::string got;
    for (const std::string& b : g.allgather(std::string(size_t(rank) * 5, char('a' + rank)))) got += b + ",";
    std::vector<int> v(1000, rank == 1 ? 42 : 0);
    g.broadcast(v.data(), v.size() * sizeof(int), 1);
    got += std::to_string(v[999]) + ",";
    std::vector<float> t(777, float(rank));
    if (rank == 0) g.send(t.data(), t.size() * sizeof(float), 2);
    if (rank == 2) g.recv(t.data(), t.size() * sizeof(float), 0);
    got += std::to_string(int(t[776]));
    return got;
  });
  EXPECT_EQ(out[0], ",bbbbb,cccccccccc,42,0");
  EXPECT_EQ(out[1], ",bbbbb,cccccccccc,42,1");
  EXPECT_EQ(out[2], ",bbbbb,cccccccccc,42,0");

  const StoreOptions mixed = store_options("group-mixed-keys");
  const auto refused = run_processes(3, [&](int rank) {
    Store store(mixed);
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = 3, .timeout = std::chrono::seconds(10),
                                       .sealer = std::make_shared<Sealer>(rank == 2 ? "another run's token" : kSecret)});
    return testing::outcome(30, [&] { g.allgather("x"); });
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(refused[size_t(r)].rfind("PeerLost: ", 0), 0u) << refused[size_t(r)];
    EXPECT_NE(refused[size_t(r)].find("failed authentication"), std::string::npos) << refused[size_t(r)];
  }
  EXPECT_NE(refused[0].find("from rank 2"), std::string::npos) << refused[0];
}

}  // namespace
}  // namespace atl
