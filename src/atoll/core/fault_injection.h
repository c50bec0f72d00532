// Fault injection for the elastic-island tests: the environment variable ATOLL_FAULT makes one
// chosen worker fail at an exact point, so a test can kill a worker in the middle of a ring
// all-reduce or of a state transfer instead of hoping a signal from outside lands there.
//
//   ATOLL_FAULT=SPEC[,SPEC...]   SPEC = ACTION:key=value[:key=value...]
//     ACTION      kill     SIGKILL to itself (the process vanishes; its sockets close)
//                 hang     SIGSTOP to itself (every thread stops, heartbeats included; SIGCONT resumes)
//                 crash    SIGKILL to its parent, then to itself: under `atoll launch` the whole run
//                          dies at this point (every worker has SIGKILL as its parent-death signal),
//                          as a kill -9 of the run would leave it
//                 corrupt  flip one byte of a state-transfer tensor on the wire (the sender's own copy
//                          stays intact), so the receiver's hash check must refuse it; or of a ring
//                          message (outer_step=S:ring_chunk=K), after it was sealed, as a tampering
//                          peer or router would (dist/seal.h: the receiver must drop it); or, with
//                          update=..., send a bad pseudo-gradient Δ at an outer step (below)
//     island=I    the worker's island (required)
//     rank=R      its rank in the island (default: any)
//     outer_step=S and ring_chunk=K   at the K-th ring message (1-based) this process sends while
//                 attempting outer step S (the step number metrics.jsonl logs, 1-based)
//     transfer=K  at the K-th tensor (1-based) this process sends in state transfers to joiners
//     admission=K in the K-th admission of joiners this process takes part in as a member of the
//                 run (1-based), before it reaches the rendezvous of the admitting view's group
//     join=start  (kill or hang, alone) at the start of every restart of the worker (`atoll worker
//                 --join`), before it reaches the store: a crash loop. The one point armed in
//                 restarted workers, and only there (a first start ignores it)
//     ckpt=POINT  in this process's save number `save` (save=K, 1-based; default 1) of a checkpoint
//                 (ckpt/checkpoint.h), at POINT: copy (the background copy of the saved tensors
//                 into staging begun, one tensor done, while the next step runs), tensor (its part file half written: after the
//                 first tensor, before the rest and the fsync; on the background writer while
//                 training goes on), part (the part written and fsynced, its index not yet handed
//                 on), manifest (the committer: manifest written, directory not yet renamed), rename
//                 (renamed, `latest` not yet moved), latest (moved, old ones not yet pruned)
//     outer_step=S and update=U   (corrupt only) the Δ this process sends while attempting outer
//                 step S: U = nan (every element NaN), scale (times 10^6), flip (sign flipped) or
//                 replay (the Δ and tag it sent in its previous exchange: a stale update)
//     delay:...:outer_step=S:seconds=X   sleep X seconds (the heartbeat goes on) before this
//                 process's exchange of outer step S: a straggler (fault.outer_deadline_s)
//     delay:...:ckpt=copy[:save=K]:seconds=X   sleep X seconds in the background copy of save K
//                 (after its first tensor): a slow copy, so the next step waits at its fence
//     stall:...:step=K:seconds=X         sleep X seconds inside inner step K (1-based, as
//                 metrics.jsonl counts) while the heartbeat goes on: a hung step (fault.step_timeout_s)
//     corrupt:...:step=K:loss=L          the loss of inner step K reads as L = nan or spike (times
//                 10^3): a broken batch (fault.spike_factor)
//   e.g. ATOLL_FAULT=kill:island=2:outer_step=3:ring_chunk=5, ATOLL_FAULT=corrupt:island=0:transfer=1,
//   ATOLL_FAULT=kill:island=1:rank=1:ckpt=tensor:save=3,
//   or both at once: ATOLL_FAULT=kill:island=2:outer_step=3:ring_chunk=5,corrupt:island=0:transfer=1
//
// The variable is read once (arm_fault_injection, at a worker's start); a malformed value is a
// ConfigError naming ATOLL_FAULT, the part and the fix. Each fault fires at most once per process,
// and a worker restarted to rejoin does not arm them again, so each happens once per run (but
// join=start, which only restarted workers arm: once per restart).
// Disarmed, every point costs one relaxed atomic load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace atl {

struct FaultSpec {
  enum class Action { kNone, kKill, kHang, kCorrupt, kCrash, kDelay, kStall };
  Action action = Action::kNone;
  int island = -1, rank = -1;  // -1: any
  int64_t outer_step = -1, ring_chunk = -1, transfer = -1, admission = -1;
  std::string ckpt{};  // a checkpoint point ("" = none)
  int64_t save = 1;    // with ckpt: the save it fires in
  bool join = false;   // join=start: at the start of a restart (--join)
  enum class Update { kNone, kNan, kScale, kFlip, kReplay };
  Update update = Update::kNone;  // corrupt:...:outer_step=S:update=U
  double seconds = 0;             // delay and stall
  int64_t step = -1;              // stall, and corrupt with loss
  enum class Loss { kNone, kNan, kSpike };
  Loss loss = Loss::kNone;        // corrupt:...:step=K:loss=L
};

// Parses one SPEC; "" is no fault. Throws ConfigError.
FaultSpec parse_fault_spec(const std::string& text);
// Parses a whole ATOLL_FAULT value (SPECs separated by commas).
std::vector<FaultSpec> parse_fault_specs(const std::string& text);

// Reads ATOLL_FAULT and arms the faults that name this worker (a ConfigError for a bad value, armed
// or not): in a restart (`join`), join=start only; in a first start, all the others.
void arm_fault_injection(int island, int rank, bool join = false);
void disarm_fault_injection();

// The points. fault_outer_step: the outer step this process now attempts (restarts the ring
// message count). fault_ring_message: one ring message is about to be sent; true when it must go
// corrupted. fault_transfer_tensor: one state-transfer tensor is about to be sent; the same.
void fault_outer_step(int64_t outer_step);
bool fault_ring_message();
bool fault_transfer_tensor();
// fault_admission: this process, a member of the run, is about to form the group of a view that
// admits joiners (counts them).
void fault_admission();
// fault_checkpoint_save: this process begins a checkpoint save (counts them). fault_checkpoint:
// the save in progress reaches `point` (one of the ckpt=POINT names).
void fault_checkpoint_save();
// fault_join_start: a restarted worker (--join) begins.
void fault_join_start();
void fault_checkpoint(const char* point);
// The corruption of the Δ this process is about to send at the outer step it attempts (kNone:
// none); fires once. fault_update_armed: some update corruption is armed here (so the sender
// keeps its previous Δ for a replay).
FaultSpec::Update fault_update();
bool fault_update_armed();
// fault_before_exchange: this process is about to exchange at outer step `outer_step` (a delay
// sleeps here; the step is given, as the delayed step with fragments starts one exchange while
// another, of the step before, may still run and count its ring messages). fault_step: inner
// step `step` (1-based) runs (a stall sleeps here).
// fault_loss: the loss of inner step `step`, corrupted if a loss fault names it.
void fault_before_exchange(int64_t outer_step);
void fault_step(int64_t step);
double fault_loss(int64_t step, double loss);

}  // namespace atl
