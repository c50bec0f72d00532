// The outer group of an elastic run: the ProcessGroup of the current membership view
// (membership.h), re-formed at the next epoch when an attempt fails, and the agreement that
// decides whether an attempt counts.
//
// One attempt (an outer step's exchange, or an admission's state transfer) goes:
//   1. formed() and lost_members() (one MGET of the view's heartbeats: a member already known
//      lost is not waited for), then the collective;
//   2. decide(ok): every worker of the view votes, one decision for all (Membership::decide).
//      A worker whose collective failed drops its group before it waits, so peers still
//      blocked in that collective with it fail at once instead of at their timeout;
//   3. commit: the caller keeps the result. Abort: the caller restores its buffers (they are
//      as before the attempt: nothing of a failed collective is kept), then reform() forms the
//      next epoch's group from the workers that are ready, and the caller retries.
// A group that does not form (a member of the new view died meanwhile) is an attempt that
// fails: the caller votes "fail" without a collective and re-forms again. Its rendezvous gives up
// as soon as a member's heartbeat lapses (within fault.heartbeat_ttl_s of its death, not after
// fault.timeout_s: GroupOptions::lost_ranks), and so does a failed collective's wait for the
// others' marks; a member alive but slow is waited for up to the timeout.
//
// Users of the group (DilocoSync's rings) are told through on_change: nullptr before the group
// is dropped (they must let go of its connections), the new group after one forms. Others ask
// group() when they need it. stats() adds up every epoch's group, so comm_bytes stays
// cumulative.
//
// A worker left out of the next view (too slow to be ready, or stopped past the heartbeat ttl)
// gets LeftRun: it must leave the run and rejoin as a new process.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "atoll/dist/group.h"
#include "atoll/dist/membership.h"
#include "atoll/dist/store.h"

namespace atl {

struct ElasticGroupOptions {
  std::string name = "outer-r0";  // the group of rank R of every island
  int connections = 1;
  std::string hostname{};  // the address to listen on (GroupOptions::hostname; "" = chosen by the store's route)
  std::chrono::milliseconds timeout{30000};  // rendezvous and collectives (fault.timeout_s)
  // This worker's peer on island i, for errors ("island 2 rank 0"); empty: "rank <group rank>".
  std::function<std::string(int island)> island_name{};
  // Told when the group goes (nullptr) and when a new one forms.
  std::function<void(ProcessGroup*)> on_change{};
  // Incidents, written by the leader of the new view (rank 0 of its lowest island) only:
  // {"event": "abort_retry", "attempt", "why", "epoch", "islands", "lost"}.
  std::function<void(const nlohmann::json&)> on_incident{};
  // fault.outer_deadline_s: how long an outer step waits for the other islands (0 = for every
  // live one: await_round is a no-op).
  std::chrono::milliseconds round_deadline{0};
  // Seals the group's traffic (GroupOptions::sealer, seal.h); null: unsealed.
  std::shared_ptr<const Sealer> sealer{};
};

class ElasticGroup {
 public:
  // Forms the group of view v, which must hold this worker's island (formed() tells whether it did).
  ElasticGroup(Store& store, Membership& membership, const View& v, const ElasticGroupOptions& opts);
  // A run's start: the group of every island, epoch 0, whose rendezvous must succeed (Timeout
  // naming the ranks that never arrived, as ProcessGroup's); then the view with every worker's
  // token (each announced before its rendezvous: Membership::announce).
  static std::unique_ptr<ElasticGroup> start(Store& store, Membership& membership, const ElasticGroupOptions& opts);
  ~ElasticGroup();
  ElasticGroup(const ElasticGroup&) = delete;
  ElasticGroup& operator=(const ElasticGroup&) = delete;

  bool formed() const { return group_ != nullptr; }
  ProcessGroup& group();  // ATOLL_CHECKs formed()
  const View& view() const { return view_; }
  Membership& membership() { return membership_; }
  int island() const { return membership_.options().island; }
  // Rank 0 of the view's lowest island: evaluates, checkpoints, writes the run's events.
  bool leads() const { return membership_.options().rank == 0 && view_.islands.front() == island(); }
  CommStats stats() const;
  // Why the current group did not form ("" when it did).
  const std::string& formation_error() const { return formation_error_; }

  // "" while every island of the view is alive, else the lost ones named ("island 2 rank 0").
  std::string lost_members();
  // This worker's outcome of `attempt`; drops the group first when !ok.
  Decision decide(const std::string& attempt, bool ok, bool admit);
  // After an aborted attempt: drops the group, adopts the next epoch's view and forms its group
  // (formed() false if that fails). `why` goes into the incident. Throws LeftRun when this island
  // is not in the view, Error when no island of it holds the run's state.
  void reform(const std::string& attempt, const std::string& why);
  // Stragglers (Membership::arrive): waits for the view's islands at `attempt` (outer step
  // `outer_step`) up to ElasticGroupOptions::round_deadline. "" when every island came, else why
  // the attempt must fail: the round closed without the late islands, which the next reform()
  // leaves out (the closer logs a `straggler` incident for each). Throws LeftRun when this island
  // is the late one: its inner work of the round was computed from an older θ than the round's
  // commit, so it leaves and rejoins with the committed state.
  std::string await_round(const std::string& attempt, int64_t outer_step);
  // Moves to `next` (a commit that admits joiners) and forms its group.
  void enter(const View& next);
  // The admission of the view's joining islands committed: they hold the state now.
  // A joiner withdraws its join request (Membership::withdraw_join).
  void admitted();

 private:
  ElasticGroup(Store& store, Membership& membership, std::unique_ptr<ProcessGroup> group, const ElasticGroupOptions& opts);
  void drop();
  // Forms the view's group; its rendezvous gives up on a member as soon as its heartbeat lapses.
  void form();
  // The group ranks (positions in the view) of the members whose heartbeat lapsed.
  std::vector<int> lost_positions();

  Store& store_;
  Membership& membership_;
  View view_;
  ElasticGroupOptions opts_;
  std::unique_ptr<ProcessGroup> group_;
  std::string formation_error_;
  CommStats retired_;  // the dropped groups' figures
  std::vector<int> late_;  // of the closed round, for the next reform()
};

}  // namespace atl
