// P "virtual ranks" in one process (core/collective.h over threads), for tests of a group's
// messages without processes (the GPU tests that run a ring on one device, the CPU test of CCA's
// boundary messages): each rank is a thread with its own ThreadGroup endpoint, and point-to-point
// messages go through one mailbox per (sender, receiver) pair, matched in the order sent, as the
// interface asks. A send never blocks (the bytes are copied into the mailbox), so an exchange is
// a send now and a receive at wait(). A receive waits at most 60 s (Timeout), so a broken ring
// fails instead of hanging. allgather (the routers' sums under context parallelism) sends the
// blob to every rank through mailboxes of its own; the all-reduces refuse (nothing here uses them).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "atoll/core/check.h"
#include "atoll/core/collective.h"
#include "atoll/core/errors.h"

namespace atl::test {

class ThreadGroup final : public Collective {
 public:
  struct Hub {
    std::mutex mu;
    std::condition_variable cv;
    // (from, to, channel) -> messages in order; channel 0: point to point, 1: allgather
    std::map<std::tuple<int, int, int>, std::deque<std::string>> boxes;
  };
  ThreadGroup(std::shared_ptr<Hub> hub, int rank, int size) : hub_(std::move(hub)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(const void* data, size_t bytes, int dst) override {
    post(std::string(static_cast<const char*>(data), bytes), dst, 0);
  }
  void recv(void* data, size_t bytes, int src) override {
    const std::string msg = take(src, 0);
    ATOLL_CHECK_EQ(msg.size(), bytes) << "message from rank " << src << " to " << rank_;
    if (bytes) std::memcpy(data, msg.data(), bytes);
  }
  std::unique_ptr<Pending> exchange(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                                    size_t recv_bytes, int src) override {
    send(send_data, send_bytes, dst);
    return std::make_unique<Receive>(this, recv_data, recv_bytes, src);
  }
  void allreduce_sum(float*, size_t) override { refuse("allreduce_sum"); }
  void allreduce_max(float*, size_t) override { refuse("allreduce_max"); }
  std::vector<std::string> allgather(const std::string& blob) override {
    for (int r = 0; r < size_; ++r)
      if (r != rank_) post(blob, r, 1);
    std::vector<std::string> all(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) all[size_t(r)] = r == rank_ ? blob : take(r, 1);
    return all;
  }

  // Runs fn(group) on P threads, one per rank; rethrows the first rank's failure once all end.
  static void run(int P, const std::function<void(Collective&)>& fn) {
    auto hub = std::make_shared<Hub>();
    std::vector<std::exception_ptr> errors(static_cast<size_t>(P));
    std::vector<std::thread> threads;
    for (int r = 0; r < P; ++r)
      threads.emplace_back([&, r] {
        ThreadGroup g(hub, r, P);
        try {
          fn(g);
        } catch (...) {
          errors[size_t(r)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

 private:
  class Receive final : public Pending {
   public:
    Receive(ThreadGroup* g, void* data, size_t bytes, int src) : g_(g), data_(data), bytes_(bytes), src_(src) {}
    ~Receive() override {
      try {
        if (!done_) wait();
      } catch (...) {  // as the interface says: destroyed unwaited, it waits and swallows errors
      }
    }
    void wait() override {
      done_ = true;
      g_->recv(data_, bytes_, src_);
    }

   private:
    ThreadGroup* g_;
    void* data_;
    size_t bytes_;
    int src_;
    bool done_ = false;
  };
  void post(std::string msg, int dst, int channel) {
    ATOLL_CHECK(dst >= 0 && dst < size_) << "send to rank " << dst << " of " << size_;
    {
      std::lock_guard<std::mutex> lock(hub_->mu);
      hub_->boxes[{rank_, dst, channel}].push_back(std::move(msg));
    }
    hub_->cv.notify_all();
  }
  std::string take(int src, int channel) {
    ATOLL_CHECK(src >= 0 && src < size_) << "recv from rank " << src << " of " << size_;
    std::unique_lock<std::mutex> lock(hub_->mu);
    auto& box = hub_->boxes[{src, rank_, channel}];
    if (!hub_->cv.wait_for(lock, std::chrono::seconds(60), [&] { return !box.empty(); }))
      throw Timeout("rank " + std::to_string(rank_) + " waited 60 s for a message from rank " + std::to_string(src));
    std::string msg = std::move(box.front());
    box.pop_front();
    return msg;
  }
  [[noreturn]] static void refuse(const char* what) {
    throw Error(std::string("ThreadGroup has no ") + what + " (its users need point to point and allgather only)");
  }

  std::shared_ptr<Hub> hub_;
  int rank_, size_;
};

}  // namespace atl::test
