// The quantized ring all-reduce, every rank a real process (fork): world sizes 1-4 x element
// counts {0, 1, fewer than ranks, uneven, large} x every codec give bit-identical results on
// every rank, within the stated error of the fp64 mean; results do not depend on the number of
// connections or the chunk size; error feedback keeps the accumulated error bounded; a dead
// peer and a stalled peer end in PeerLost / Timeout within the bound, with the input unchanged.
#include "atoll/dist/ring_allreduce.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>

#include "atoll/core/errors.h"
#include "atoll/supervise/redis_server.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::hash_floats;
using testing::put;
using testing::run_processes;
using testing::take;
using testing::test_value;

const Codec kCodecs[] = {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4};

class RingTest : public testing::RedisSuite {};

// Every rank's input, the fp64 mean, and per element the bound A on |x| over all ranks and
// every element within a codec block of it (blocks start anywhere in a segment).
struct Reference {
  std::vector<std::vector<float>> x;
  std::vector<double> mean, absmax;
  Reference(int size, size_t n, uint64_t seed) : x(size, std::vector<float>(n)), mean(n, 0.0), absmax(n, 0.0) {
    const size_t blocks = (n + kCodecBlock - 1) / kCodecBlock;
    std::vector<double> block_max(blocks + 2, 0.0);
    for (int r = 0; r < size; ++r)
      for (size_t i = 0; i < n; ++i) {
        x[r][i] = test_value(seed, r, i);
        mean[i] += static_cast<double>(x[r][i]) / size;
        block_max[i / kCodecBlock + 1] =
            std::max(block_max[i / kCodecBlock + 1], std::fabs(static_cast<double>(x[r][i])));
      }
    for (size_t i = 0; i < n; ++i) {
      const size_t g = i / kCodecBlock + 1;
      absmax[i] = std::max({block_max[g - 1], block_max[g], block_max[g + 1]});
    }
  }
  // Largest error relative to the stated bound (<= 1 passes).
  double worst_ratio(const std::vector<float>& got, Codec codec, int size) const {
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::fabs(got[i] - mean[i]) / ring_error_bound(codec, size, absmax[i]));
    return worst;
  }
};

// fp32 bytes one rank sends: reduce-scatter sends every segment but the owned one (r+1),
// all-gather forwards every segment but the last one received (r+2).
uint64_t fp32_bytes(int size, int rank, size_t n) {
  if (size == 1) return 0;
  auto len = [&](int s) { return n / size + (static_cast<size_t>(s % size) < n % size ? 1 : 0); };
  return 4 * (2 * n - len(rank + 1) - len(rank + 2));
}

TEST_F(RingTest, IdenticalOnEveryRankAndWithinTheStatedErrorForAllSizesCountsAndCodecs) {
  for (int size = 1; size <= 4; ++size) {
    const std::vector<size_t> counts = {0, 1, static_cast<size_t>(size - 1), 1000, 1003, size_t{1} << 20};
    const std::string run = "sweep" + std::to_string(size);
    const auto out = run_processes(size, [&](int rank) {
      Store store(store_options(run));
      ProcessGroup g(store, GroupOptions{.rank = rank, .size = size, .connections = 2});
      std::string result;
      for (size_t n : counts) {
        const Reference ref(size, n, 11 + n);
        for (Codec codec : kCodecs) {
          RingAllreduce ring(g, RingOptions{.codec = codec, .chunk_bytes = 64 << 10});
          std::vector<float> data = ref.x[rank];
          ring.mean(data.data(), n);
          put(result, hash_floats(data.data(), n));
          put(result, n ? ref.worst_ratio(data, codec, size) : 0.0);
          put(result, ring.stats().bytes_sent);
        }
      }
      return result;
    });
    for (int r = 0; r < size; ++r) ASSERT_EQ(out[r].size(), counts.size() * 4 * 24) << out[r];
    for (int r = 0; r < size; ++r) {
      size_t at = 0, at0 = 0;
      for (size_t n : counts)
        for (Codec codec : kCodecs) {
          const auto hash = take<uint64_t>(out[r], at), hash0 = take<uint64_t>(out[0], at0);
          const double ratio = take<double>(out[r], at);
          const auto bytes = take<uint64_t>(out[r], at);
          at0 += 16;
          const std::string where = "size " + std::to_string(size) + " rank " + std::to_string(r) + " n " +
                                    std::to_string(n) + " " + codec_name(codec);
          EXPECT_EQ(hash, hash0) << where << ": differs from rank 0";
          EXPECT_LE(ratio, 1.0) << where << ": error above the stated bound";
          if (codec == Codec::kFp32) {
            EXPECT_EQ(bytes, fp32_bytes(size, r, n)) << where;
          }
        }
    }
  }
}

// Lanes are independent rings and codec blocks start at the same places whatever the chunk
// size, so connections and chunk size change the speed, never the numbers.
TEST_F(RingTest, SeveralConnectionsAndChunkSizesGiveTheSameBits) {
  const int size = 3;
  const size_t n = 300001;
  const auto out = run_processes(size, [&](int rank) {
    Store store(store_options("conns"));
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = size, .connections = 4});
    const Reference ref(size, n, 5);
    std::string result;
    for (Codec codec : {Codec::kBf16, Codec::kInt4})
      for (auto [conns, chunk] :
           {std::pair{1, size_t{1} << 20}, {4, size_t{16} << 10}, {2, size_t{4} << 10}, {3, size_t{1000}}}) {
        RingAllreduce ring(g, RingOptions{.codec = codec, .chunk_bytes = chunk, .connections = conns});
        std::vector<float> data = ref.x[rank];
        ring.mean(data.data(), n);
        put(result, hash_floats(data.data(), n));
      }
    return result;
  });
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(out[r].size(), 8u * 8) << out[r];
    EXPECT_EQ(out[r], out[0]) << "rank " << r;
    size_t at = 0;
    std::vector<uint64_t> h;
    for (int i = 0; i < 8; ++i) h.push_back(take<uint64_t>(out[r], at));
    for (int i = 1; i < 4; ++i) EXPECT_EQ(h[i], h[0]) << "bf16 setting " << i;
    for (int i = 5; i < 8; ++i) EXPECT_EQ(h[i], h[4]) << "int4 setting " << i;
  }
}

// zstd over the codec bytes is lossless: the same bits as without it, on every rank, for every
// codec; bell-shaped int8 data (like a pseudo-gradient) goes out in fewer bytes, and data that
// does not compress costs only the 4-byte header per message.
TEST_F(RingTest, CompressionGivesTheSameBitsInFewerBytes) {
  for (int size : {1, 2, 3}) {
    const size_t n = 100003;
    const std::string run = "zstd" + std::to_string(size);
    const auto out = run_processes(size, [&](int rank) {
      Store store(store_options(run));
      ProcessGroup g(store, GroupOptions{.rank = rank, .size = size, .connections = 2});
      std::vector<float> bell(n);  // a sum of four uniforms per element
      for (size_t i = 0; i < n; ++i)
        for (int k = 0; k < 4; ++k) bell[i] += test_value(17 + k, rank, i);
      std::string result;
      for (Codec codec : kCodecs)
        for (bool compress : {false, true}) {
          RingAllreduce ring(g, RingOptions{.codec = codec, .chunk_bytes = 16 << 10, .compress = compress});
          std::vector<float> data = bell;
          ring.mean(data.data(), n);
          put(result, hash_floats(data.data(), n));
          put(result, ring.stats().bytes_sent);
        }
      return result;
    });
    for (int r = 0; r < size; ++r) {
      ASSERT_EQ(out[r].size(), 4u * 2 * 16) << out[r];
      size_t at = 0;
      for (Codec codec : kCodecs) {
        const std::string where = "size " + std::to_string(size) + " rank " + std::to_string(r) + " " + codec_name(codec);
        const auto plain_hash = take<uint64_t>(out[r], at);
        const auto plain_bytes = take<uint64_t>(out[r], at);
        const auto z_hash = take<uint64_t>(out[r], at);
        const auto z_bytes = take<uint64_t>(out[r], at);
        EXPECT_EQ(z_hash, plain_hash) << where;
        EXPECT_EQ(out[r].substr(0, 8), out[0].substr(0, 8)) << where << ": differs from rank 0";
        if (size == 1) {
          EXPECT_EQ(z_bytes, 0u) << where;
          continue;
        }
        const uint64_t messages = 2 * (size - 1) * ((n / size + 1 + 4095) / 4096);  // 16 KiB chunks
        EXPECT_LE(z_bytes, plain_bytes + 4 * messages) << where;
        if (codec == Codec::kInt8) {
          EXPECT_LT(z_bytes, plain_bytes * 0.97) << where;
        }
      }
    }
  }
}

TEST_F(RingTest, ErrorFeedbackKeepsTheAccumulatedErrorBounded) {
  const int size = 3, rounds = 30;
  const size_t n = 5000;
  const auto out = run_processes(size, [&](int rank) {
    Store store(store_options("feedback"));
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = size});
    const Reference ref(size, n, 9);
    std::string result;
    for (bool feedback : {false, true}) {
      RingAllreduce ring(g, RingOptions{.codec = Codec::kInt4, .chunk_bytes = 4096, .error_feedback = feedback});
      std::vector<double> sum(n, 0.0);
      for (int k = 0; k < rounds; ++k) {
        std::vector<float> data = ref.x[rank];
        ring.mean(data.data(), n);
        for (size_t i = 0; i < n; ++i) sum[i] += data[i];
      }
      // Accumulated error over all rounds, in units of one round's stated bound.
      double worst = 0;
      for (size_t i = 0; i < n; ++i)
        worst = std::max(
            worst, std::fabs(sum[i] - rounds * ref.mean[i]) / ring_error_bound(Codec::kInt4, size, ref.absmax[i]));
      put(result, worst);
    }
    return result;
  });
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(out[r].size(), 16u) << out[r];
    size_t at = 0;
    const double without = take<double>(out[r], at), with = take<double>(out[r], at);
    // With feedback the sum of 30 results is off by at most what the residuals hold, about one
    // round's error; without, the same rounding repeats and the error grows with the rounds.
    EXPECT_LE(with, 2.0) << "rank " << r;
    EXPECT_GT(without, 5.0 * with) << "rank " << r;
  }
}

TEST_F(RingTest, WorldSizeOneAppliesTheCodecRounding) {
  Store store(store_options("single"));
  ProcessGroup g(store, GroupOptions{});
  std::vector<float> x(3000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = test_value(1, 0, i);
  for (Codec codec : kCodecs) {
    RingAllreduce ring(g, RingOptions{.codec = codec});
    std::vector<float> got = x, want(x.size());
    ring.mean(got.data(), got.size());
    std::vector<uint8_t> bytes(encoded_bytes(codec, x.size()));
    encode(codec, x.data(), x.size(), bytes.data());
    decode(codec, bytes.data(), x.size(), want.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), x.size() * 4), 0) << codec_name(codec);
  }
}

TEST_F(RingTest, ADeadPeerIsPeerLostAtOnceAndTheInputIsUnchanged) {
  const auto out = run_processes(2, [&](int rank) {
    Store store(store_options("dead"));
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = 2, .connections = 2, .timeout = milliseconds(20000)});
    RingAllreduce ring(g, RingOptions{.codec = Codec::kInt8, .chunk_bytes = 16 << 10});
    std::vector<float> data(100000, static_cast<float>(rank));
    ring.mean(data.data(), data.size());
    if (rank == 1) return std::string("leaving");  // the process exits: its sockets close
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 17);
    const std::vector<float> before = data;
    const auto t0 = Clock::now();
    std::string what = "no error";
    try {
      ring.mean(data.data(), data.size());
    } catch (const PeerLost& e) {
      what = std::string("PeerLost: ") + e.what();
    } catch (const Timeout& e) {
      what = std::string("Timeout: ") + e.what();
    }
    const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
    const bool unchanged = data == before;
    bool refused = false;
    try {
      g.barrier();
    } catch (const PeerLost&) {
      refused = true;  // the group is broken: no collective runs on it again
    }
    return what + "|ms=" + std::to_string(ms) + "|unchanged=" + std::to_string(unchanged) +
           "|refused=" + std::to_string(refused);
  });
  EXPECT_EQ(out[1], "leaving");
  EXPECT_EQ(out[0].rfind("PeerLost: ", 0), 0u) << out[0];
  EXPECT_NE(out[0].find("ring mean (int8, 100000 floats)"), std::string::npos) << out[0];
  EXPECT_NE(out[0].find("unchanged=1"), std::string::npos) << out[0];
  EXPECT_NE(out[0].find("refused=1"), std::string::npos) << out[0];
  const long ms = std::stol(out[0].substr(out[0].find("ms=") + 3));
  EXPECT_LT(ms, 5000) << "noticed by waiting out the timeout, not by the closed connection: " << out[0];
}

TEST_F(RingTest, AStalledPeerIsATimeoutWithinTheBoundAndTheInputIsUnchanged) {
  const auto out = run_processes(3, [&](int rank) {
    Store store(store_options("stall"));
    ProcessGroup g(store, GroupOptions{.rank = rank, .size = 3, .timeout = milliseconds(20000)});
    RingAllreduce ring(g, RingOptions{.codec = Codec::kBf16, .timeout = milliseconds(1000)});
    std::vector<float> data(5000, 1.0f);
    ring.mean(data.data(), data.size());
    if (rank == 2) {  // alive but silent until both others have given up (exiting earlier
                      // would close its connections: PeerLost, not Timeout, for a slow rank)
      store.wait({store.run_prefix() + "/done0", store.run_prefix() + "/done1"});
      return std::string("released");
    }
    const std::vector<float> before = data;
    const auto t0 = Clock::now();
    std::string what = "no error";
    try {
      ring.mean(data.data(), data.size());
    } catch (const Timeout& e) {
      what = std::string("Timeout: ") + e.what();
    } catch (const PeerLost& e) {
      what = std::string("PeerLost: ") + e.what();
    }
    const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
    store.set(store.run_prefix() + "/done" + std::to_string(rank), "1");
    // Stay until the other has given up too: exiting closes this rank's connections, which a
    // slower (loaded) peer would see as PeerLost rather than its own Timeout.
    store.wait({store.run_prefix() + "/done0", store.run_prefix() + "/done1"});
    return what + "|ms=" + std::to_string(ms) + "|unchanged=" + std::to_string(data == before);
  });
  EXPECT_EQ(out[2], "released");
  // The first to time out may close its connections (Gloo does on a timeout), so the other can
  // see a lost peer instead of its own timeout (seen under load); at least one times out.
  int timeouts = 0;
  for (int r = 0; r < 2; ++r) {
    timeouts += out[r].rfind("Timeout: ", 0) == 0;
    EXPECT_TRUE(out[r].rfind("Timeout: ", 0) == 0 || out[r].rfind("PeerLost: ", 0) == 0) << out[r];
    EXPECT_NE(out[r].find("unchanged=1"), std::string::npos) << out[r];
    const long ms = std::stol(out[r].substr(out[r].find("ms=") + 3));
    EXPECT_GE(ms, 900) << out[r];
    EXPECT_LT(ms, 4000) << out[r];
  }
  EXPECT_GE(timeouts, 1) << out[0] << "\n" << out[1];
}

}  // namespace
}  // namespace atl
