// Membership of an elastic run in the store (DESIGN.md "Faults and membership"): who is in the
// run at which epoch, who is alive, what every member agreed about an attempt, who waits to
// rejoin. Only Redis keys here; the Gloo groups that follow the views are elastic_group.h's.
//
// Workers are named "I.R" (island I, rank R of M). Every process has a token ("HOST:PID:NONCE",
// the nonce 64 random bits), so a restarted worker is never taken for the one it replaces, and a
// message can name the process behind a token. Keys, all under "atoll/<run>/members/":
//
//   hb/I.R                 heartbeat: the token, written with an expiry of fault.heartbeat_ttl_s
//                          every fault.heartbeat_s by a background thread on its own connection,
//                          only while the key is absent or its own (see "One process per place")
//   view/e<E>              the view of epoch E (JSON: islands, joining, tokens), written once
//   epoch                  the newest epoch with a view (joiners poll it)
//   e<E>/ready/I.R         this worker's token: it is ready for epoch E (after a failed attempt)
//   e<E>/<attempt>/vote/I.R       "ok" | "fail": this worker's outcome of an attempt in epoch E
//   e<E>/<attempt>/decision       what every worker of the view does: {"commit": bool, "next"?: view}
//   e<E>/<attempt>/arrived/I.R    this worker's token: it reached the attempt (fault.outer_deadline_s)
//   e<E>/<attempt>/round          the islands of the attempt's round, once it closed (JSON array)
//   join/I.R               a restarted worker's request to rejoin: its token (withdrawn once admitted)
//   record/I.R             the worker's own record at its newest committed outer step (its data
//                          cursor), which a restarted worker continues from
//   done                   the run finished its last step
//   config                 the config the run started with (a joiner must bring the same)
//   run_token              the verifier of the run's token (seal.h run_token_verifier: the token
//                          itself never reaches the store); atoll launch writes it before any worker starts
// With dist.seal every other key here carries a MAC of the run's key (store.h StoreOptions::records).
//
// Trust at the door: a worker presents the run's token (MembershipOptions::run_token; compared
// through its verifier) before it
// writes anything (check_run_token): a wrong or missing one is refused with a ConfigError and
// the run's keys stay as they were. A run started by hand without a launcher has no token in
// the store until a worker brings one: the first token written stands, and a run whose workers
// bring none is open to any worker that reaches its store (the store's password still guards it).
// A token is wrong at once wherever that can be known: a run that has another token refuses it;
// a run that does not exist yet refuses a token that is another run's on the store (the worker
// got the run id wrong: the error names the run), and a joiner refuses to wait for a run that
// does not exist (expect_run). Only the first worker of a new run cannot tell a wrong token from
// its own run's: it founds the run, says which other runs the store holds, and waits for peers.
//
// One process per place (a hostile or mistaken second worker as I.R): a worker claims hb/I.R
// before it writes anything else to the run (start_heartbeat), only while it is absent. A
// heartbeat there is another process's: a live one rewrites it every fault.heartbeat_s, which
// moves its expiry, and the newcomer is refused (ConfigError "island I rank R is running (pid P,
// host H)") within about one interval, having written nothing; a dead one's (a killed worker that
// its launcher, or a person, restarts) is never rewritten and lapses within the ttl, and the
// newcomer takes the place then. So a restart needs no word from the launcher about the process
// it replaces: that process is dead, and its heartbeat says so within the ttl. The heartbeat
// thread rewrites the key only while it is its own: a worker stopped past the ttl whose place was
// taken meanwhile does not take it back when it runs on (place_taken(); it is out of the view
// and leaves the run).
//
// Liveness: worker I.R of view v is alive while hb/I.R holds the token v recorded for it; an
// island is alive while every rank of it is. A worker killed or stopped (SIGSTOP stops the
// heartbeat thread too) is lost within the ttl; a worker that leaves cleanly deletes its key.
//
// Agreement (as torchft's should_commit: no member commits an outer step another discards):
// every worker votes on each attempt (an outer step's exchange, an admission), and the first
// worker to know the outcome writes the decision with SETNX; everyone follows the decision, so
// every survivor keeps or discards the attempt alike. Abort as soon as any vote is "fail" (or
// after fault.timeout_s); commit once every worker of the view voted "ok" or is lost (a worker
// that voted nothing yet is waited for while alive; an ok from every live worker means the
// collective completed with every member's contribution, so the lost one changes nothing). The
// worker that commits may admit joiners: when every rank of an island outside the view asks to
// join (join/I.R = hb/I.R), the decision carries the next view, epoch + 1, with those islands
// `joining` (they receive the run's state before they count as members).
//
// Re-forming after an aborted attempt (reform): each survivor marks itself ready for epoch + 1,
// then waits until every island of the old view is ready (all its ranks) or lost, at most
// fault.timeout_s; the first to get there proposes the ready islands with SETNX and everyone
// adopts the view written. An island not in it (too slow, or stopped past the ttl) must leave
// the run and rejoin.
//
// A worker stopped while it waits (SIGSTOP, or starved) for longer than the ttl starts the wait
// again when it runs on: what it knew of its peers is that old too, and a wait it found over at
// once would let it decide alone (abort for want of votes, or propose a view of itself only).
//
// A store that restarts (empty: store.h "Restarts"): every worker keeps what the run needs from
// it (the run token, the config, the newest view and epoch, its vote, ready mark, decision read,
// join request, record, done) and its connections write them back on reconnecting; the
// heartbeat thread's connection does so within one interval. For one ttl after its own
// connection came back, a worker judges no liveness and writes no decision or proposal, so a
// live peer is never counted lost for a heartbeat the restart erased, nor a decision another
// worker already acted on decided anew.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "atoll/dist/store.h"

namespace atl {

struct View {
  uint64_t epoch = 0;
  std::vector<int> islands;                   // ascending; a group's rank is the island's position here
  std::vector<int> joining;                   // islands of `islands` still to receive the run's state
  std::map<std::string, std::string> tokens;  // "I.R" -> the token of that worker in this view

  bool contains(int island) const;
  bool is_joining(int island) const;
  int position(int island) const;  // -1 when absent
  std::vector<int> holders() const;  // islands that hold the run's state (not joining)
  std::string describe() const;      // "epoch 3: islands 0, 2 (joining 2)"
  std::string to_json() const;
  static View from_json(const std::string& text);
};

struct MembershipOptions {
  int island = 0, rank = 0;               // this worker
  int islands = 1, workers_per_island = 1;
  std::chrono::milliseconds heartbeat{1000};
  std::chrono::milliseconds ttl{5000};
  std::chrono::milliseconds timeout{60000};  // fault.timeout_s: votes and readiness wait at most this
  std::string run_token = {};                // the run's token this worker presents ("" = none)
};

// "pid 1234, host h": the process behind a worker's token, for messages.
std::string describe_process(const std::string& token);

// Writes the run's token under "atoll/<run>/members/run_token" (the launcher, before it starts
// any worker); a run's token is written once (ConfigError if another is there).
void publish_run_token(Store& store, const std::string& token);

struct Decision {
  bool commit = false;
  std::string why;                // abort: who failed
  std::optional<View> next;       // commit: the view that admits joiners, if any
};

// The records other workers wrote in the store, read back: a decision ({"commit", "why"?,
// "next"?: a view}), a round's islands (a JSON array) and the epoch (a decimal number). Each is
// checked whole (types, islands ascending and non-negative, joiners among the islands, the epoch
// a number); IoError naming the record otherwise.
Decision parse_decision(const std::string& text);
std::vector<int> parse_round(const std::string& text);
uint64_t parse_epoch(const std::string& text);

// What an observer outside the run reads of its membership, taking no part in it (the
// launcher's live view, supervise/status_model.h): every worker's heartbeat, its token and when it
// expires (Unix ms on the store's clock), indexed island * M + rank, nullopt where absent; and the
// newest view (nullopt before the first is published). Reads only; store errors are thrown as
// they are (IoError, Timeout).
struct MembershipSnapshot {
  std::vector<std::optional<Store::Expiring>> heartbeats;
  std::optional<View> view;
};
MembershipSnapshot read_membership(Store& store, int islands, int workers_per_island);

// The attempt name of outer step `outer_step` ("s<outer_step>") and of an admission ("admit").
std::string outer_attempt(int64_t outer_step);
inline const char* kAdmitAttempt = "admit";

class Membership {
 public:
  // Uses `store` (shared, thread-safe) for everything but heartbeats, which get their own
  // connection. Heartbeats start with start_heartbeat().
  Membership(Store& store, const MembershipOptions& opts);
  ~Membership();  // stops the heartbeat and deletes its key: peers see this worker gone at once
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  const std::string& token() const { return token_; }
  const MembershipOptions& options() const { return opts_; }
  static std::string worker_name(int island, int rank);  // "I.R"

  // Refuses (ConfigError) a token that is not the run's, none where the run has one, or, for a
  // run not on the store yet, another run's; writes nothing then. Call it before anything else
  // that writes to the store.
  void check_run_token();

  // A joiner (--join), before check_run_token: the run must exist on this store (its token or a
  // view there, within one ttl: a store that just restarted gets them back from the live
  // workers); else ConfigError at once, naming the runs the store holds, rather than a wait for
  // an admission that never comes.
  void expect_run();

  // Claims this worker's place with its first heartbeat (it exists when this returns), then
  // refreshes it in the background. A live other process in the place: ConfigError naming it
  // (see "One process per place"); a dead one's heartbeat: waited out (at most the ttl).
  void start_heartbeat();
  // The heartbeat found another process's token in this worker's place (this one was lost, its
  // heartbeat lapsed, and a restarted worker took the place): it no longer writes it.
  bool place_taken() const { return place_taken_.load(); }

  // Epoch 0, every island: announce() before the start-up rendezvous, initial_view() after it
  // (every worker has announced by then; waits at most the timeout for the tokens).
  void announce();
  View initial_view();

  // Liveness by position in v.islands. Thread-safe (a failed collective on an exchange's thread
  // asks it: group.h GroupOptions::lost_ranks).
  std::vector<bool> alive(const View& v);
  bool all_alive(const View& v);

  // This worker's outcome of `attempt` in v's epoch; returns what every worker of v does.
  // `admit`: a commit may admit the islands waiting to join.
  Decision decide(const View& v, const std::string& attempt, bool ok, bool admit);

  // After an aborted attempt in view v: the view of epoch v.epoch + 1 (maybe without this island:
  // the caller checks). `joining`: islands of v not yet admitted; they stay joining.
  // `left_out`: islands of v not waited for (late for a closed round): they are not in the view.
  // A view without an island that holds the run's state (only joiners left) is never published
  // where v had a holder: after waiting the timeout for one, it is returned unpublished, and the
  // caller's joiners leave to rejoin.
  View reform(const View& v, const std::vector<int>& joining, const std::vector<int>& left_out = {});

  // This worker reaches `attempt` of v's epoch; waits for the round to close (see above). Every
  // worker of the round gets the same islands. All-lost stragglers are not waited for and close
  // nothing (`closed` false, islands = v's): the attempt's liveness check handles them.
  struct Round {
    std::vector<int> islands;  // the round's, ascending
    bool closed = false;       // a round was written (possibly without some of v's islands)
    bool closed_here = false;  // by this worker
    double waited_s = 0;       // from this worker's arrival to the close
  };
  Round arrive(const View& v, const std::string& attempt, std::chrono::milliseconds deadline);

  // A restarted worker: asks to rejoin, then waits for a view that admits it (nullopt: the run
  // finished first; each view is returned once). Throws Error when no island of the newest view is alive for longer than
  // the timeout (nothing left to rejoin), Timeout when `until` passes first (a worker that
  // rejoins by itself within fault.rejoin_timeout_s).
  void request_join();
  std::optional<View> wait_admission(
      std::chrono::steady_clock::time_point until = std::chrono::steady_clock::time_point::max());
  // Once admitted: the request is withdrawn, so that this process, if it is later lost and let
  // go (SIGCONT) with its heartbeat back, is not admitted again on it while it leaves the run.
  void withdraw_join();

  std::optional<View> view(uint64_t epoch);
  void put_record(const std::string& record);                // this worker's
  std::optional<std::string> record(int island, int rank);   // any worker's
  void mark_done();
  bool done();
  void put_config(const std::string& text);  // the first writer's stands
  std::optional<std::string> config();

 private:
  std::string key(const std::string& rest) const;  // "atoll/<run>/members/<rest>"
  std::string attempt_key(uint64_t epoch, const std::string& attempt, const std::string& rest) const;
  std::vector<std::string> worker_keys(const std::string& prefix, const std::vector<int>& islands) const;
  // Islands outside v whose every rank asks to join, with their tokens.
  std::vector<int> waiting_joiners(const View& v, std::map<std::string, std::string>* tokens);
  // Writes view/e<E> once and advances `epoch`; returns the view that won.
  View publish(const View& proposal);
  void heartbeat_loop();
  // check_run_token's case of a run not on the store yet; start_heartbeat's claim of hb/I.R.
  void check_new_run();
  void claim_place();
  // True for one ttl after this worker's store connection came back from a loss (a restarted
  // store is empty until the live workers write their heartbeats and kept keys back): liveness,
  // decisions and proposals wait for it.
  bool store_settling();

  Store& store_;
  MembershipOptions opts_;
  std::string me_;     // "I.R"
  std::string token_;
  std::unique_ptr<Store> beat_store_;  // the heartbeat thread's own connection
  std::thread beat_;
  std::mutex beat_mu_;
  std::condition_variable beat_cv_;
  bool stop_ = false;
  std::atomic<bool> place_taken_{false};
  std::optional<uint64_t> admitted_;  // the epoch wait_admission last returned
  std::mutex settle_mu_;  // guards the two below
  uint64_t reconnections_seen_ = 0;
  std::chrono::steady_clock::time_point settled_at_{};
};

}  // namespace atl
