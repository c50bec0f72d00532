// The thread that writes checkpoints while training goes on (ckpt/checkpoint.h): the training
// step blocks only for a snapshot of what it saves, then hands the write (files, fsyncs, the
// commit) to this thread as a job. One job at a time: a save due while the previous one is still
// being written waits for it (submit returns how long), so saves never pile up. A job's failure
// (an IoError: disk full) is rethrown to the training thread by the next submit() or wait(), so
// it ends the run as a synchronous save's would have.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace atl {

class BackgroundWriter {
 public:
  BackgroundWriter();
  ~BackgroundWriter();  // waits for the job in flight (its error, if any, is dropped)
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Waits for the previous job (rethrowing its error), then starts `job`; returns the seconds
  // waited.
  double submit(std::function<void()> job);
  // Waits until no job is in flight; rethrows the failure of the last one.
  void wait();
  // Seconds the last completed job ran; < 0 before the first completes.
  double last_job_s() const;

 private:
  void run();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false, closing_ = false;
  std::exception_ptr error_;
  double last_job_s_ = -1;
  std::thread thread_;  // last: started once the rest is ready
};

}  // namespace atl
