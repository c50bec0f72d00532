// Streaming DiLoCo's driver (Douillard et al. 2025, https://arxiv.org/abs/2501.18512): after every
// inner step it asks the fragment schedule (fragments.h) what is due and runs the outer steps of
// dist/diloco.h, blocking or overlapped with the next inner steps.
//
//   τ = 0 (blocking): at fragment f's sync step, after a barrier (idle time: waiting for the
//     slowest island), snapshot, exchange and apply at once; θ_local_f ← θ_f (no mixing).
//   τ > 0 (overlapped): at the sync step t the main thread takes the snapshot Δ_f and starts
//     the exchange on a background thread; inner steps t+1..t+τ compute meanwhile. After step
//     t+τ the main thread waits for the exchange (comm time: it is blocked), applies the outer
//     step to θ_f and merges into the live parameters, θ_local_f ← α·θ_local_f + (1−α)·θ_f
//     (α = diloco.mixing; the local progress of the τ steps is kept in part, as in the paper).
//     No barrier: a straggler's delay is absorbed by the overlap, and whatever is left shows up
//     as the main thread's wait.
//   The last step: every exchange in flight is finished (applied and merged), then one blocking
//     sync of every fragment (θ_local ← θ), so every island ends on the same θ.
//
// Threads: only the background thread uses the outer group while an exchange is in flight (the
// validation τ·P < H means the next fragment's sync starts no earlier than this one's end, and
// checkpoints wait until nothing is in flight); the in-island gradient all-reduce runs on
// another group. The ring and its codecs open no OpenMP regions, so they do not fight the main
// thread's OpenMP pool (they do compete with it for cores: that shows up in compute_s).
//
// Failures: a Timeout or PeerLost in the background exchange is rethrown on the main thread, as
// the same type with the fragment named, when it waits for it; θ and m are then unchanged.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <thread>

#include "atoll/dist/diloco.h"
#include "atoll/dist/fragments.h"
#include "atoll/dist/group.h"

namespace atl {

struct StreamingOptions {
  int64_t inner_steps = 100;  // H
  int overlap_steps = 0;      // τ
  double mixing = 0.5;        // α, used when τ > 0
};

// What after_step() did on the main thread.
struct StreamStep {
  std::optional<SyncResult> synced;  // an outer step was applied (the last one, if several)
  int started = -1;                  // fragment whose overlapped exchange started, or -1
  double comm_s = 0;                 // blocked in an exchange or waiting for one
  double idle_s = 0;                 // at the barrier before a blocking sync
  double overlap_s = 0;              // wall time of an overlapped exchange finished here
};

class StreamingDiloco {
 public:
  StreamingDiloco(DilocoSync& sync, ProcessGroup& outer, const StreamingOptions& opts);
  ~StreamingDiloco();  // waits for an exchange still in flight, dropping its result
  StreamingDiloco(const StreamingDiloco&) = delete;
  StreamingDiloco& operator=(const StreamingDiloco&) = delete;

  // Called after inner step `step` (1-based) of `last_step`, with the live local parameters.
  StreamStep after_step(int64_t step, int64_t last_step, float* theta_local);

  bool in_flight() const { return flight_f_ >= 0; }
  const FragmentSchedule& schedule() const { return schedule_; }

 private:
  SyncResult finish_in_flight(float* theta_local, StreamStep& out);

  DilocoSync& sync_;
  ProcessGroup& outer_;
  StreamingOptions opts_;
  FragmentSchedule schedule_;
  std::thread thread_;
  int flight_f_ = -1;         // fragment in flight
  int64_t flight_step_ = 0;   // its sync step
  std::exception_ptr flight_error_;
  double flight_s_ = 0;
};

}  // namespace atl
