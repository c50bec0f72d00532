// Process groups, with every rank a real process: barrier, broadcast, allgather of blobs of
// different sizes, gather to one rank, config comparison, Gloo's sum all-reduce over several connections on
// integer data (exact sums), and the failures: a rank that never arrives, a rank joining twice.
#include "atoll/dist/group.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "atoll/core/errors.h"
#include "atoll/supervise/redis_server.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::put;
using testing::run_processes;
using testing::take;

class GroupTest : public testing::RedisSuite {};

TEST_F(GroupTest, SmallCollectivesOnWorldSizes1To4) {
  for (int size = 1; size <= 4; ++size) {
    const std::string run = "small" + std::to_string(size);
    const auto out = run_processes(size, [&](int rank) {
      Store store(store_options(run));
      ProcessGroup g(store, GroupOptions{.rank = rank, .size = size, .connections = 2, .timeout = milliseconds(10000)});
      g.barrier();
      int64_t value = rank == size - 1 ? 4242 : -1;
      g.broadcast(&value, sizeof(value), size - 1);
      const auto blobs = g.allgather(std::string(rank, static_cast<char>('a' + rank)));  // rank 0's is empty
      std::string result;
      put(result, value);
      for (int r = 0; r < size; ++r) result += blobs[r] + "|";
      g.expect_same("model config", "same everywhere");
      // gather to the last rank: 1003 bytes per rank (not a multiple of anything), rank r's all r.
      const int root = size - 1;
      const std::vector<uint8_t> mine(1003, static_cast<uint8_t>(rank + 1));
      std::vector<uint8_t> all(rank == root ? mine.size() * size : 0);
      g.gather(mine.data(), mine.size(), rank == root ? all.data() : nullptr, root);
      for (int r = 0; rank == root && r < size; ++r)
        for (size_t i = 0; i < mine.size(); ++i)
          if (all[r * mine.size() + i] != r + 1) return "gather: byte " + std::to_string(i) + " of rank " + std::to_string(r);
      return result;
    });
    std::string expected_blobs;
    for (int r = 0; r < size; ++r) expected_blobs += std::string(r, static_cast<char>('a' + r)) + "|";
    for (int r = 0; r < size; ++r) {
      ASSERT_GE(out[r].size(), 8u) << out[r];
      size_t at = 0;
      EXPECT_EQ(take<int64_t>(out[r], at), 4242) << "size " << size << " rank " << r;
      EXPECT_EQ(out[r].substr(at), expected_blobs) << "size " << size << " rank " << r;
    }
  }
}

// Point to point between some ranks only, interleaved with collectives of the whole group
// (which must not be thrown off: send/recv use no tag of the group's sequence): every rank but
// the last sends a message of an awkward size to the last, twice, with a 3 MB broadcast from
// rank 1 (not 0) and a barrier between; the last receives them not in rank order. Bytes checked
// exactly.
TEST_F(GroupTest, SendRecvBetweenSomeRanksAmidCollectives) {
  const int size = 4;
  const auto out = run_processes(size, [&](int rank) -> std::string {
    Store store(store_options("p2p"));
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = size, .timeout = milliseconds(10000)});
    const int last = size - 1;
    auto message = [](int from, int k) {  // k-th message of rank `from`: 1001 + 7k bytes
      std::vector<uint8_t> m(size_t(1001 + 7 * k));
      for (size_t i = 0; i < m.size(); ++i) m[i] = uint8_t(from * 31 + k * 7 + i);
      return m;
    };
    auto exchange = [&](int k) -> std::string {
      if (rank != last) g.send(message(rank, k).data(), message(rank, k).size(), last);
      for (int from = last - 1; rank == last && from >= 0; --from) {
        std::vector<uint8_t> got(message(from, k).size());
        g.recv(got.data(), got.size(), from);
        if (got != message(from, k)) return "message " + std::to_string(k) + " of rank " + std::to_string(from);
      }
      return "";
    };
    if (std::string e = exchange(0); !e.empty()) return e;
    std::vector<uint8_t> big(3 << 20);
    for (size_t i = 0; i < big.size(); ++i) big[i] = rank == 1 ? uint8_t(i * 13) : 0;
    g.broadcast(big.data(), big.size(), 1);
    for (size_t i = 0; i < big.size(); ++i)
      if (big[i] != uint8_t(i * 13)) return "broadcast: byte " + std::to_string(i);
    g.barrier();
    if (std::string e = exchange(1); !e.empty()) return e;
    g.barrier();
    return "ok";
  });
  EXPECT_EQ(out, std::vector<std::string>(size, "ok"));
}

TEST_F(GroupTest, ExpectSameNamesTheRankThatDiffers) {
  const auto out = run_processes(3, [&](int rank) {
    Store store(store_options("differ"));
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = 3});
    g.expect_same("model config", rank == 2 ? "d_model = 64\nlayers = 3\n" : "d_model = 64\nlayers = 2\n");
    return std::string("no error");
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(out[r].find("rank 2's model config differs from rank 0's"), std::string::npos) << out[r];
    EXPECT_NE(out[r].find("layers = 3"), std::string::npos) << out[r];
  }
}

// Integer-valued data: every partial sum is exact in fp32, so the result is exact.
TEST_F(GroupTest, AllreduceSumIsExactOnIntegersForAllSizesAndCounts) {
  for (int size = 1; size <= 4; ++size) {
    const std::string run = "sum" + std::to_string(size);
    const std::vector<size_t> counts = {0, 1, static_cast<size_t>(size - 1), 1000, 1003, size_t{1} << 20};
    const auto out = run_processes(size, [&](int rank) {
      Store store(store_options(run));
      // Small buckets: 1<<20 floats become 16 buckets spread over 3 connections.
      ProcessGroup g(store, GroupOptions{.rank = rank, .size = size, .connections = 3, .bucket_bytes = 256 << 10});
      std::string bad;
      for (size_t n : counts) {
        std::vector<float> x(n);
        for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 1000));
        g.allreduce_sum(x.data(), n);
        const float factor = static_cast<float>(size * (size + 1) / 2);
        for (size_t i = 0; i < n; ++i)
          if (x[i] != factor * static_cast<float>(i % 1000)) {
            bad += "n=" + std::to_string(n) + " i=" + std::to_string(i) + " got " + std::to_string(x[i]) + "; ";
            break;
          }
      }
      const CommStats s = g.stats();
      return bad.empty() && (size == 1 || s.bytes_sent > 0) ? std::string("ok") : "bad: " + bad;
    });
    for (int r = 0; r < size; ++r) EXPECT_EQ(out[r], "ok") << "size " << size << " rank " << r;
  }
}

// Uneven parts, an empty one and a large one: every rank ends with every rank's values, in
// place, and the others' parts start as garbage that must be overwritten.
TEST_F(GroupTest, AllgathervFillsEveryRanksPartInPlace) {
  for (int size = 1; size <= 4; ++size) {
    const std::string run = "allgatherv" + std::to_string(size);
    const auto out = run_processes(size, [&](int rank) {
      Store store(store_options(run));
      ProcessGroup g(store, GroupOptions{.rank = rank, .size = size});
      std::vector<size_t> counts(static_cast<size_t>(size));
      for (int r = 0; r < size; ++r) counts[size_t(r)] = r == 1 ? 0 : size_t(r) * 1001 + (r == 2 ? 300000 : 7);
      size_t total = 0, mine = 0;
      for (int r = 0; r < size; ++r) (r < rank ? mine : total) += counts[size_t(r)];
      total += mine;
      std::vector<float> x(total, -1.0f);
      for (size_t i = 0; i < counts[size_t(rank)]; ++i) x[mine + i] = float(rank * 1000000 + int(i));
      g.allgatherv(x.data(), counts);
      size_t at = 0;
      for (int r = 0; r < size; ++r)
        for (size_t i = 0; i < counts[size_t(r)]; ++i, ++at)
          if (x[at] != float(r * 1000000 + int(i))) return "rank " + std::to_string(r) + "'s value " + std::to_string(i);
      return std::string("ok");
    });
    for (int r = 0; r < size; ++r) EXPECT_EQ(out[r], "ok") << "size " << size << " rank " << r;
  }
}

TEST_F(GroupTest, ARankThatNeverArrivesIsATimeoutNamingIt) {
  // Ranks 0 and 1 of a group of 3 come; rank 2 never does.
  const auto out = run_processes(2, [&](int rank) {
    Store store(store_options("missing"));
    const auto t0 = Clock::now();
    try {
      ProcessGroup g(store, GroupOptions{.rank = rank, .size = 3, .timeout = milliseconds(1000)});
      return std::string("connected without rank 2");
    } catch (const Timeout& e) {
      const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
      return "timeout after " + std::to_string(ms) + " ms: " + e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(out[r].find("rank(s) 2 of 3 did not arrive within 1 s"), std::string::npos) << out[r];
    EXPECT_NE(out[r].find("atoll/missing/world/e0"), std::string::npos) << out[r];
    const long ms = std::stol(out[r].substr(std::strlen("timeout after ")));
    EXPECT_GE(ms, 1000) << out[r];
    EXPECT_LT(ms, 4000) << out[r];
  }
}

TEST_F(GroupTest, ListensOnANamedInterfaceAndRejectsAnUnknownOne) {
  const auto out = run_processes(2, [&](int rank) {
    Store store(store_options("iface"));
    float x = 1.0f + rank;
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = 2, .iface = "lo"});
    g.allreduce_sum(&x, 1);
    std::string bad = "no error";
    try {
      ProcessGroup(store, GroupOptions{.name = "other", .rank = rank, .size = 2, .iface = "atoll-no-such-if0"});
    } catch (const ConfigError& e) {
      bad = e.what();
    }
    return std::to_string(x) + "|" + bad;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(out[r].rfind("3.0", 0), 0u) << out[r];
    EXPECT_NE(out[r].find("cannot listen on interface 'atoll-no-such-if0'"), std::string::npos) << out[r];
  }
}

TEST_F(GroupTest, TheSameRankTwiceIsAConfigError) {
  Store store(store_options("twice"));
  ProcessGroup first(store, GroupOptions{.rank = 0, .size = 1});
  EXPECT_THROW(ProcessGroup(store, GroupOptions{.rank = 0, .size = 1}), ConfigError);
  // A new membership epoch is a new group: the same rank may join it.
  ProcessGroup next(store, GroupOptions{.rank = 0, .size = 1, .epoch = 1});
  EXPECT_EQ(next.prefix(), "atoll/twice/world/e1");
}

}  // namespace
}  // namespace atl
