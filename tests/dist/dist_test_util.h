// Helpers for the distributed tests: real processes (fork), deterministic data, byte packing.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "atoll/core/errors.h"
#include "atoll/dist/fragments.h"
#include "atoll/dist/store.h"
#include "atoll/supervise/redis_server.h"

namespace atl::testing {

// A test suite with its own redis-server on loopback, started once for the suite; tests
// rendezvous under their own run id so they never see each other's keys.
class RedisSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new RedisServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static StoreOptions store_options(const std::string& run) {
    return StoreOptions{.url = server_->url(), .run_id = run, .timeout = std::chrono::milliseconds(20000)};
  }
  inline static RedisServer* server_ = nullptr;
};

// What `op` ended in, as a process of run_processes reports it: "completed", "PeerLost: <what>"
// or "Timeout: <what>", with " (after S s)" when it took longer than `within_s`.
inline std::string outcome(double within_s, const std::function<void()>& op) {
  const auto start = std::chrono::steady_clock::now();
  std::string result;
  try {
    op();
    result = "completed";
  } catch (const PeerLost& e) {
    result = std::string("PeerLost: ") + e.what();
  } catch (const Timeout& e) {
    result = std::string("Timeout: ") + e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (s > within_s) result += " (after " + std::to_string(s) + " s)";
  return result;
}

// Runs fn(rank) for rank 0..size-1, each in its own forked process, and returns what each
// returned, in rank order. A child that throws sends back "ERROR: <what>" instead (the test
// decides whether that is expected); a child that crashes or outlives `deadline` fails the test,
// unless its rank is in `may_die` (a fault test kills it on purpose): its result is then "DIED".
// Children leave with _exit, so they never run the parent's destructors (its redis-server
// stays up) or its remaining tests.
inline std::vector<std::string> run_processes(int size, const std::function<std::string(int rank)>& fn,
                                              std::chrono::seconds deadline = std::chrono::seconds(60),
                                              const std::vector<int>& may_die = {}) {
  std::vector<int> fds(size);
  std::vector<pid_t> pids(size);
  for (int r = 0; r < size; ++r) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::close(p[0]);
      std::string out;
      try {
        out = "OK:" + fn(r);
      } catch (const std::exception& e) {
        out = std::string("ERROR: ") + e.what();
      }
      for (size_t done = 0; done < out.size();) {
        const ssize_t w = ::write(p[1], out.data() + done, out.size() - done);
        if (w <= 0) ::_exit(2);
        done += static_cast<size_t>(w);
      }
      ::_exit(0);
    }
    ::close(p[1]);
    fds[r] = p[0];
    pids[r] = pid;
  }
  // Read every pipe as data arrives (a child blocked on a full pipe must not stall the others).
  std::vector<std::string> out(size);
  std::vector<bool> open(size, true);
  const auto end = std::chrono::steady_clock::now() + deadline;
  for (int left = size; left > 0;) {
    std::vector<pollfd> polls;
    std::vector<int> who;
    for (int r = 0; r < size; ++r)
      if (open[r]) {
        polls.push_back({fds[r], POLLIN, 0});
        who.push_back(r);
      }
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count();
    if (ms <= 0 || ::poll(polls.data(), polls.size(), static_cast<int>(ms)) <= 0) {
      for (auto pid : pids) ::kill(pid, SIGKILL);
      ADD_FAILURE() << "child processes did not finish within " << deadline.count() << " s";
      break;
    }
    for (size_t i = 0; i < polls.size(); ++i) {
      if (!(polls[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      const ssize_t got = ::read(polls[i].fd, buf, sizeof(buf));
      if (got > 0) {
        out[who[i]].append(buf, static_cast<size_t>(got));
      } else {
        open[who[i]] = false;
        --left;
      }
    }
  }
  for (int r = 0; r < size; ++r) {
    ::close(fds[r]);
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    if (out[r].rfind("OK:", 0) == 0) {
      out[r] = out[r].substr(3);
    } else if (std::find(may_die.begin(), may_die.end(), r) != may_die.end()) {
      out[r] = "DIED";
    } else if (out[r].rfind("ERROR: ", 0) != 0) {
      ADD_FAILURE() << "rank " << r << " died (status " << status << ") without a result";
    }
  }
  return out;
}

// Appends / reads plain values to / from a byte string (results sent back by children).
template <typename T>
void put(std::string& s, const T& v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T take(const std::string& s, size_t& at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof(T));
  at += sizeof(T);
  return v;
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Deterministic test input of rank r: uniform in [-1, 1) times a magnitude that changes every
// 300 elements over 1e-3..1e3, so codec blocks see many different scales.
inline float test_value(uint64_t seed, int rank, size_t i) {
  const uint64_t h = splitmix64(seed * 1000003u + static_cast<uint64_t>(rank) * 0x100000001ull + i);
  const double u = static_cast<double>(h >> 11) / 9007199254740992.0 * 2.0 - 1.0;
  const double mag = std::pow(10.0, static_cast<int>((i / 300) % 7) - 3);
  return static_cast<float>(u * mag);
}

// An island's parameters at the start (every island alike), and one inner "step" of island
// `rank`: a rank- and step-dependent drift (the outer-step drivers' tests: streaming, delay).
inline std::vector<float> test_theta0(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = test_value(1, 0, i);
  return x;
}
inline void test_drift(std::vector<float>& local, int rank, int64_t step) {
  for (size_t i = 0; i < local.size(); ++i) local[i] -= 0.01f * test_value(uint64_t(step) + 11, rank, i);
}

// FNV-1a over the bytes of a float buffer: equal hashes <=> (almost surely) equal bits.
inline uint64_t hash_floats(const float* x, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const uint8_t*>(x);
  for (size_t i = 0; i < n * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// A layout shaped like model/layout.h's: embed, per layer {norm, wq, w1}, final_norm, head, each
// offset aligned to 16 elements (so there is padding between tensors), sizes uneven.
inline std::vector<TensorSpan> fake_layout(int layers, size_t* total) {
  std::vector<TensorSpan> t;
  size_t at = 0;
  auto add = [&](const std::string& name, size_t numel, int layer) {
    t.push_back({name, at, numel, layer});
    at = (at + numel + 15) / 16 * 16;
  };
  add("embed", 101, -1);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "attn_norm", 7, l);
    add(p + "attn.wq", 33 + size_t(l), l);
    add(p + "moe.w1", 50, l);
  }
  add("final_norm", 7, -1);
  add("head", 99, -1);
  *total = at;
  return t;
}

}  // namespace atl::testing
