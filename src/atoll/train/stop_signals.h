// Ctrl-C (SIGINT) and SIGTERM during `atoll train`. The first asks the run to stop: the driver
// finishes the current step, writes a checkpoint of it and returns (DriverOptions::
// stop_requested), and the command says where the run can resume from and exits: 0 after SIGTERM
// (preemption: the run stopped as asked, with nothing lost), 128 + 2 after Ctrl-C (the shell's
// convention for an interrupted command). A second one exits at once (status 128 + the signal),
// printing the last complete checkpoint: what it interrupts (a checkpoint being written, say) is
// left as a temporary directory that the next start removes (run_dir.h remove_leftover_writes).
// SIGTERM has a grace period (checkpoint.grace_s): if the final checkpoint is not written by
// then, the process exits as on a second signal, so a preempting machine's SIGKILL never finds
// it half way; grace 0 exits at once.
//
// The signals are taken by a thread of their own (sigwait), never by a thread that computes: a
// signal handler's frame is pushed below the interrupted thread's stack pointer, and oneDNN's
// JIT kernels were seen to corrupt the heap when a handler ran in the middle of a matrix
// product. So the constructor blocks both signals in the calling thread, and every thread
// started after it inherits that; create it before anything starts threads (the data loader,
// OpenMP's pool). A thread started earlier that still takes one hands it on to the signal
// thread. One StopSignals may exist at a time; the destructor puts back the previous handlers
// and the calling thread's mask.
#pragma once

#include <signal.h>

#include <string>
#include <thread>

namespace atl {

class StopSignals {
 public:
  // sigterm_grace_s: seconds a SIGTERM leaves for the final checkpoint (< 0: no limit).
  explicit StopSignals(double sigterm_grace_s = -1);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received, 0 while none.
  int signal() const;
  // The run whose newest complete checkpoint (ckpt/checkpoint.h latest_checkpoint, read from
  // disk when the second signal comes) a second signal names.
  void set_run_dir(const std::string& dir);

 private:
  void wait_for_signals();
  double sigterm_grace_s_;
  std::thread thread_;
  sigset_t old_mask_{};
  struct sigaction old_int_{}, old_term_{};
};

}  // namespace atl
