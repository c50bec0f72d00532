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
// Time budget (sync_seconds > 0, with one fragment and τ = 0: config.cc refuses the rest): a
// round (the inner steps between two outer steps) ends at the end of the inner step during which
// sync_seconds of wall time have passed since it began (the previous outer step's commit, or the
// construction / begin_round()), after at least 1 inner step and at most H. The caller reports
// each inner step's tokens (count_step) before after_step(); the exchange carries the round's
// step and tokens (DilocoSync::set_round), the mean weights each Δ by its tokens, and the
// applied step reports the round's furthest step, which the caller adopts. Joiners are not
// admitted at a commit whose furthest step is the last. The decision of a step is taken once
// (due() reads the clock on its first call for that step), so the caller and after_step agree.
//
// Threads: only the background threads use the outer group while an exchange is in flight (the
// validation τ·P < H means the next fragment's sync starts no earlier than this one's end, and
// checkpoints wait until nothing is in flight); the in-island gradient all-reduce runs on
// another group. The delayed outer step with fragments has one exchange in flight per fragment:
// they run one after another in the order they started (each thread waits for the one before
// it), so the outer group still has one user at a time, and fragment f's own is always the oldest
// at f's due step (the fragments are due in turn), the only one the main thread waits for. The
// ring and its codecs open no OpenMP regions, so they do not fight the main thread's OpenMP pool
// (they do compete with it for cores: that shows up in compute_s).
//
// Failures, with a fixed group: a Timeout or PeerLost in the background exchange is rethrown on
// the main thread, as the same type with the fragment named, when it waits for it; θ and m are
// then unchanged.
//
// Failures, elastic (an ElasticGroup): every outer step is an attempt that every island votes
// on (elastic_group.h). An exchange that fails (or is not even tried: a member's heartbeat is
// gone, the group did not form) is voted down; a step not committed is discarded (θ, m,
// θ_local and the residual are as before it) and retried blocking, with the same Δ_f, over the
// next epoch's group, which holds the islands still alive: the mean is over the islands that
// contribute. An overlapped exchange that fails is retried the same way at its wait point.
// Before the group is dropped or re-formed (a vote down, a retry), every exchange in flight is
// drained first: none may still use the old group. When an attempt is aborted, the exchanges
// in flight behind it are discarded with it, and once its retry commits they run again, in their
// order, over the new group (every island aborted the same attempt, so every island reruns the
// same ones); each is still voted on at its own wait point.
// A committed step may admit joiners (islands restarted after a loss): take_admission() hands
// the next view to the caller, which moves every island to it before the next step (the state
// transfer is train/'s). Joiners are admitted only where no exchange is in flight or starts in
// the same step, and never at the last step.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "atoll/dist/diloco.h"
#include "atoll/dist/elastic_group.h"
#include "atoll/dist/fragments.h"
#include "atoll/dist/group.h"
#include "atoll/dist/outer_delay.h"

namespace atl {

struct StreamingOptions {
  int64_t inner_steps = 100;  // H
  int overlap_steps = 0;      // τ
  double mixing = 0.5;        // α, used when τ > 0
  double sync_seconds = 0;    // > 0: rounds end on this time budget, H their cap (see above)
  OuterDelay* delay = nullptr;  // diloco.outer_delay = 1 (streaming_delay.cc; τ = 0, no time budget)
};

// What after_step() did on the main thread.
struct StreamStep {
  std::optional<SyncResult> synced;  // an outer step was applied (the last one, if several)
  int started = -1;                  // fragment whose overlapped exchange started, or -1
  double comm_s = 0;                 // blocked in an exchange or waiting for one
  double idle_s = 0;                 // at the barrier before a blocking sync
  double overlap_s = 0;              // wall time of an overlapped exchange finished here
  std::vector<UpdateIncident> incidents;  // Δs dropped or clipped in the outer steps applied here
  int64_t round_steps = 0, round_tokens = 0;  // time budget, synced: this island's round just committed
};

class StreamingDiloco {
 public:
  // Over a fixed group: a failure ends the run.
  StreamingDiloco(DilocoSync& sync, ProcessGroup& outer, const StreamingOptions& opts);
  // Elastic: failed outer steps are discarded and retried over the next epoch's group.
  StreamingDiloco(DilocoSync& sync, ElasticGroup& elastic, const StreamingOptions& opts);
  ~StreamingDiloco();  // waits for an exchange still in flight, dropping its result
  StreamingDiloco(const StreamingDiloco&) = delete;
  StreamingDiloco& operator=(const StreamingDiloco&) = delete;

  // Called after inner step `step` (1-based) of `last_step`, with the live local parameters.
  StreamStep after_step(int64_t step, int64_t last_step, float* theta_local);

  // The fragment whose sync starts after inner step `step` (the schedule, or under the time
  // budget 0 once the round is over), or -1; the last step is the final sync, not counted here.
  int due(int64_t step, int64_t last_step);
  // Time budget: the inner step just taken trained `tokens` on this island (before after_step).
  void count_step(int64_t tokens);
  // Time budget: a round begins now (the rounds begin by themselves at every committed outer step).
  void begin_round();

  bool in_flight() const { return !flights_.empty(); }
  // A checkpoint may be taken now: nothing is in flight, or (the delayed outer step) the newest
  // exchange in flight started at the step just taken. Every exchange in flight can be redone from
  // the state the checkpoint saves (its Δ_f, and its residuals as they were: delay_inputs.h).
  bool checkpoint_safe() const { return !in_flight() || (opts_.delay && flights_.back()->step == last_after_); }
  // The delayed outer step, resumed from a checkpoint taken after inner step `step` with Δs
  // pending: their exchanges start again in the order they first started, which the schedule
  // gives (every island redoes them from the same saved state).
  void resume_in_flight(int64_t step);
  const FragmentSchedule& schedule() const { return schedule_; }
  // The view a committed outer step admitted joiners into, once (elastic only).
  std::optional<View> take_admission();

 private:
  ProcessGroup& outer();
  // after_step() less the time budget's round bookkeeping.
  StreamStep step_once(int64_t step, int64_t last_step, float* theta_local);
  // Barrier and exchange of fragment f (Δ_f taken); "" or why it failed (elastic only).
  std::string try_exchange(int f, StreamStep& out);
  // Before an elastic exchange: the stragglers' round of outer step `as_step` (ElasticGroup::await_round).
  std::string await_round(int64_t as_step);
  // The elastic outer step of fragment f after its exchange (done, or failed with `failure`):
  // applied once every island agrees, else discarded and retried over the next epoch's group.
  SyncResult settle(int f, std::string failure, float* theta_local, double mixing, bool admit, StreamStep& out);
  SyncResult blocking_step(int f, float* theta_local, bool admit, StreamStep& out);
  // Fragment f's exchange (Δ_f taken) on the background thread, after inner step `step`; elastic:
  // not started when it cannot succeed (its wait point votes it down).
  void start_exchange(int f, int64_t step, StreamStep& out);
  // after_step() of the delayed outer step (streaming_delay.cc).
  StreamStep delayed_step(int64_t step, int64_t last_step, float* theta_local);
  // One blocking outer step of every fragment; the delayed step's from each fragment's round start.
  SyncResult final_sync(float* theta_local, StreamStep& out);
  // The oldest exchange in flight: waited for, then applied (elastic: settled).
  SyncResult finish_in_flight(float* theta_local, bool admit, StreamStep& out);
  // Waits for every exchange in flight to end (their results stay for their wait points).
  void drain(StreamStep& out);
  // Flight k's exchange on its own thread, after flight k − 1's has ended.
  void run(size_t k);
  // After a commit over a re-formed group: the exchanges discarded with the aborted attempt before
  // it run again over the new group, in their order (each island reruns the same ones).
  void rerun_discarded();
  // The applied step's incidents into out, each with its member's island.
  SyncResult note_incidents(SyncResult r, StreamStep& out);
  bool budget() const { return opts_.sync_seconds > 0; }
  // Time budget: whether a commit may admit joiners (not when the round reached the last step).
  bool may_admit(int f, bool admit) const;

  DilocoSync& sync_;
  ProcessGroup* outer_ = nullptr;    // a fixed group, or
  ElasticGroup* elastic_ = nullptr;  // an elastic one
  StreamingOptions opts_;
  FragmentSchedule schedule_;
  // An exchange in flight: fragment f's, started after inner step `step`, tagged as outer step
  // `as_step` (the one it becomes: they are applied in order, DilocoSync::exchange).
  struct Flight {
    int f = -1;
    int64_t step = 0, as_step = 0;
    std::thread thread;             // not started: elastic knew it would fail (failure says why)
    std::shared_future<void> done;  // ready once its exchange has ended or was not started
    std::exception_ptr error;
    std::string failure;  // elastic: why it failed or was not started
    double seconds = 0;
    bool rerun = false;   // elastic: discarded with an aborted attempt before it, to run again (rerun_discarded)
  };
  std::deque<std::unique_ptr<Flight>> flights_;  // oldest first
  std::optional<View> admission_;
  // The time budget's round: when it began, its inner steps and tokens; due()'s decision for a step.
  double round_start_ = 0;
  int64_t round_steps_ = 0, round_tokens_ = 0;
  int64_t decided_step_ = -1;
  int decided_ = -1;
  int64_t last_step_ = 0;
  int64_t last_after_ = -1;  // the step of the latest after_step()
};

}  // namespace atl
