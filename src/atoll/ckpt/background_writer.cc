#include "atoll/ckpt/background_writer.h"

#include <utility>

#include "atoll/core/timer.h"

namespace atl {

BackgroundWriter::BackgroundWriter() : thread_([this] { run(); }) {}

BackgroundWriter::~BackgroundWriter() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    closing_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundWriter::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return closing_ || (busy_ && job_); });
    if (closing_) return;
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    const double t0 = now_s();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    last_job_s_ = now_s() - t0;
    error_ = error;
    busy_ = false;
    released_ = true;
    cv_.notify_all();
  }
}

double BackgroundWriter::submit(std::function<void()> job) {
  const double t0 = now_s();
  wait();
  const double waited = now_s() - t0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
    busy_ = true;
    released_ = false;
    unfenced_ = true;
  }
  cv_.notify_all();
  return waited;
}

void BackgroundWriter::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void BackgroundWriter::release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
  }
  cv_.notify_all();
}

std::optional<double> BackgroundWriter::fence() {
  const double t0 = now_s();
  std::unique_lock<std::mutex> lock(mu_);
  if (!std::exchange(unfenced_, false)) return std::nullopt;
  cv_.wait(lock, [&] { return released_; });
  return now_s() - t0;
}

double BackgroundWriter::last_job_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_job_s_;
}

}  // namespace atl
