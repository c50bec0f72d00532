// The thread that writes checkpoints while training goes on (ckpt/checkpoint.h): the training
// step blocks only for what must match the step (the plan and the small values), then hands the
// rest to this thread as a job: the copy of the saved tensors into staging, then the write
// (files, fsyncs, the commit). The job calls release() once its copy is taken; until then the
// training thread may read the saved tensors but not write them, and fence() is where it waits
// before it does (the optimizer step of the next step, say). One job at a time: a save due while the previous one is still
// being written waits for it (submit returns how long), so saves never pile up. A job's failure
// (an IoError: disk full) is rethrown to the training thread by the next submit() or wait(), so
// it ends the run as a synchronous save's would have.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
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
  // From the job: what it reads of the caller's buffers is copied; fence() may return.
  void release();
  // Waits until the last job submitted has released (or ended: also when it failed, whose
  // error the next submit() or wait() rethrows). The seconds waited, for the first call after a
  // submit(); nullopt for later calls, and before the first submit().
  std::optional<double> fence();
  // Seconds the last completed job ran; < 0 before the first completes.
  double last_job_s() const;

 private:
  void run();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false, closing_ = false;
  bool released_ = true;   // the job in flight has released the caller's buffers
  bool unfenced_ = false;  // no fence() since the last submit()
  std::exception_ptr error_;
  double last_job_s_ = -1;
  std::thread thread_;  // last: started once the rest is ready
};

}  // namespace atl
