// The outer group of an elastic run (see elastic_group.h).
#include "atoll/dist/elastic_group.h"

#include <algorithm>
#include <atomic>
#include <memory>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/fault_injection.h"
#include "atoll/core/worker_phase.h"

namespace atl {

ElasticGroup::ElasticGroup(Store& store, Membership& membership, const View& v, const ElasticGroupOptions& opts)
    : store_(store), membership_(membership), view_(v), opts_(opts) {
  ATOLL_CHECK(view_.contains(island())) << "island " << island() << " is not in the view " << view_.describe();
  form();
}

ElasticGroup::ElasticGroup(Store& store, Membership& membership, std::unique_ptr<ProcessGroup> group,
                           const ElasticGroupOptions& opts)
    : store_(store), membership_(membership), view_(membership.initial_view()), opts_(opts), group_(std::move(group)) {}

std::unique_ptr<ElasticGroup> ElasticGroup::start(Store& store, Membership& membership, const ElasticGroupOptions& opts) {
  const MembershipOptions& m = membership.options();
  // The first group forms before the initial view exists, so its liveness is asked through the
  // ElasticGroup once that is built: none during the first rendezvous, the heartbeats from then
  // on (without this, the first epoch's collectives waited the whole timeout for a stopped member).
  auto owner = std::make_shared<std::atomic<ElasticGroup*>>(nullptr);
  auto group = std::make_unique<ProcessGroup>(
      store, GroupOptions{.name = opts.name, .rank = m.island, .size = m.islands, .epoch = 0, .hostname = opts.hostname,
                          .connections = opts.connections, .timeout = opts.timeout, .member_name = opts.island_name,
                          .lost_ranks = [owner] {
                            ElasticGroup* g = owner->load();
                            return g ? g->lost_positions() : std::vector<int>{};
                          },
                          .sealer = opts.sealer});
  std::unique_ptr<ElasticGroup> elastic(new ElasticGroup(store, membership, std::move(group), opts));
  owner->store(elastic.get());
  return elastic;
}

ElasticGroup::~ElasticGroup() = default;

ProcessGroup& ElasticGroup::group() {
  ATOLL_CHECK(group_ != nullptr) << "the outer group of " << view_.describe() << " did not form: " << formation_error_;
  return *group_;
}

CommStats ElasticGroup::stats() const {
  CommStats s = retired_;
  if (group_) {
    const CommStats g = group_->stats();
    s.bytes_sent += g.bytes_sent, s.seconds += g.seconds, s.ops += g.ops;
  }
  return s;
}

void ElasticGroup::form() {
  formation_error_.clear();
  std::function<std::string(int)> member_name;
  if (opts_.island_name)
    member_name = [name = opts_.island_name, islands = view_.islands](int g) { return name(islands[size_t(g)]); };
  try {
    group_ = std::make_unique<ProcessGroup>(
        store_, GroupOptions{.name = opts_.name, .rank = view_.position(island()), .size = int(view_.islands.size()),
                             .epoch = view_.epoch, .hostname = opts_.hostname, .connections = opts_.connections, .timeout = opts_.timeout,
                             .member_name = member_name, .lost_ranks = [this] { return lost_positions(); },
                             .sealer = opts_.sealer});
  } catch (const Timeout& e) {
    formation_error_ = e.what();
  } catch (const PeerLost& e) {
    formation_error_ = e.what();
  }
  if (group_ && opts_.on_change) opts_.on_change(group_.get());
}

void ElasticGroup::drop() {
  if (!group_) return;
  if (opts_.on_change) opts_.on_change(nullptr);  // users let go of the connections first
  retired_ = stats();
  group_.reset();  // closes the connections: a peer waiting on us fails now
}

std::vector<int> ElasticGroup::lost_positions() {
  const std::vector<bool> alive = membership_.alive(view_);
  std::vector<int> lost;
  for (size_t g = 0; g < alive.size(); ++g)
    if (!alive[g]) lost.push_back(int(g));
  return lost;
}

std::string ElasticGroup::lost_members() {
  std::string lost;
  for (const int g : lost_positions()) {
    const int i = view_.islands[size_t(g)];
    lost += (lost.empty() ? "" : ", ") + (opts_.island_name ? opts_.island_name(i) : "island " + std::to_string(i));
  }
  return lost;
}

Decision ElasticGroup::decide(const std::string& attempt, bool ok, bool admit) {
  if (!ok) drop();
  return membership_.decide(view_, attempt, ok, admit);
}

void ElasticGroup::reform(const std::string& attempt, const std::string& why) {
  enter_phase(WorkerPhase::kRecovering);  // until the next step begins (core/worker_phase.h)
  drop();
  const View old = view_;
  const View next = membership_.reform(old, old.joining, late_);
  late_.clear();
  if (!next.contains(island()))
    throw LeftRun("island " + std::to_string(island()) + " is not in membership " + next.describe() +
                  " (re-formed after " + attempt + " failed: " + why + "); it leaves the run to rejoin");
  // Membership::reform returns such a view unpublished: the holders may only be starved, so
  // this joiner leaves to rejoin (admitted again once a holder commits), rather than end the run.
  if (next.holders().empty())
    throw LeftRun("island " + std::to_string(island()) + ": no island that holds the run's state answered within " +
                  "fault.timeout_s while membership " + next.describe() + " was re-formed (after " + attempt +
                  " failed: " + why + "); it leaves the run to rejoin when one is back");
  view_ = next;
  if (opts_.on_incident && leads()) {
    std::vector<int> lost;
    for (int i : old.islands)
      if (!next.contains(i)) lost.push_back(i);
    opts_.on_incident({{"event", "abort_retry"}, {"attempt", attempt}, {"why", why}, {"epoch", next.epoch},
                       {"islands", next.islands}, {"lost", lost}});
  }
  form();
}

std::string ElasticGroup::await_round(const std::string& attempt, int64_t outer_step) {
  if (opts_.round_deadline.count() <= 0) return "";
  const Membership::Round round = membership_.arrive(view_, attempt, opts_.round_deadline);
  if (!round.closed) return "";
  const char* deadline_s = "fault.outer_deadline_s";
  if (std::find(round.islands.begin(), round.islands.end(), island()) == round.islands.end())
    throw LeftRun("island " + std::to_string(island()) + " was late for outer step " + std::to_string(outer_step) +
                  ": the round closed without it after " + deadline_s + "; it leaves the run to rejoin with the "
                  "committed state (its inner work of this round is discarded)");
  std::string late;
  for (int i : view_.islands) {
    if (std::find(round.islands.begin(), round.islands.end(), i) != round.islands.end()) continue;
    late_.push_back(i);
    late += (late.empty() ? "" : ", ") + (opts_.island_name ? opts_.island_name(i) : "island " + std::to_string(i));
    if (opts_.on_incident && round.closed_here)
      opts_.on_incident({{"event", "straggler"}, {"island", i}, {"outer_step", outer_step}, {"epoch", view_.epoch},
                         {"late_s", round.waited_s}, {"reported_by", island()}});
  }
  if (late.empty()) return "";
  return late + " late: the round of outer step " + std::to_string(outer_step) + " closed without it after " +
         deadline_s;
}

void ElasticGroup::admitted() {
  if (view_.is_joining(island())) membership_.withdraw_join();
  view_.joining.clear();
}

void ElasticGroup::enter(const View& next) {
  ATOLL_CHECK(next.epoch > view_.epoch && next.contains(island())) << next.describe() << " after " << view_.describe();
  drop();
  view_ = next;
  fault_admission();
  form();
}

}  // namespace atl
