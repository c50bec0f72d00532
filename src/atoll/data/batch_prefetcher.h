// Prepares the next training batch on a background thread while the step runs.
//
// A loader whose batches are a pure function of (state, B) hands its fill function here:
// next(from, B) returns the batch starting at `from` and starts filling the one after it, of
// the same size. A prefetched batch is used only when its start state and size both match the
// request, so a changed batch size (a ramp) or a restored cursor costs one synchronous fill and
// never a wrong batch. Used by DataLoader (State = its position) and MixtureLoader (State = the
// whole mixture's cursor).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "atoll/core/check.h"

namespace atl {

template <class State>
class BatchPrefetcher {
 public:
  // Fills inputs[B, T] and targets[B, T] from `from` and returns the state after them. Must be
  // safe to call from the background thread while the owner is idle in next().
  using Fill = std::function<State(const State& from, int B, int32_t* inputs, int32_t* targets)>;

  BatchPrefetcher(Fill fill, int T, bool enabled) : fill_(std::move(fill)), T_(T) {
    if (enabled) thread_ = std::thread([this] { loop(); });
  }
  ~BatchPrefetcher() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The batch of B windows starting at `from` (overwritten into inputs/targets); returns the state
  // after it.
  State next(const State& from, int B, int32_t* inputs, int32_t* targets) {
    ATOLL_CHECK_GT(B, 0) << "batch size";
    if (!thread_.joinable()) return fill_(from, B, inputs, targets);
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !busy_ && !has_request_; });
    State end;
    if (has_result_ && job_start_ == from && job_B_ == B) {
      const size_t n = static_cast<size_t>(B) * T_;
      std::copy_n(job_inputs_.data(), n, inputs);
      std::copy_n(job_targets_.data(), n, targets);
      end = job_end_;
    } else {
      // No usable prefetch (first call, or the batch size or state changed): fill it here. The
      // thread is idle, so nothing else reads meanwhile.
      end = fill_(from, B, inputs, targets);
    }
    job_start_ = end;
    job_B_ = B;
    has_result_ = false;
    has_request_ = true;
    cv_.notify_all();
    return end;
  }

  // Waits for a batch in flight and forgets it (the owner is about to move its state).
  void drop() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !busy_ && !has_request_; });
    has_result_ = false;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return stop_ || has_request_; });
      if (stop_) return;
      has_request_ = false;
      busy_ = true;
      const size_t n = static_cast<size_t>(job_B_) * T_;
      job_inputs_.resize(n);
      job_targets_.resize(n);
      lk.unlock();
      bool ok = true;
      State end;
      try {
        end = fill_(job_start_, job_B_, job_inputs_.data(), job_targets_.data());
      } catch (...) {
        ok = false;  // the synchronous path will redo it and report the error
      }
      lk.lock();
      job_end_ = end;
      has_result_ = ok;
      busy_ = false;
      cv_.notify_all();
    }
  }

  Fill fill_;
  int T_;
  // Guarded by mu_: at most one request in flight, one result kept.
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool busy_ = false;  // the thread is filling the job
  bool has_request_ = false;
  bool has_result_ = false;
  State job_start_{}, job_end_{};
  int job_B_ = 0;
  std::vector<int32_t> job_inputs_, job_targets_;
  std::thread thread_;  // last: started after, and joined before, everything it reads
};

}  // namespace atl
