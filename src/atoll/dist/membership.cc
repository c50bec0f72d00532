// Membership in the store (see membership.h).
#include "atoll/dist/membership.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"

namespace atl {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;
using nlohmann::json;

std::string seconds_text(Ms d) {
  std::ostringstream s;
  s << static_cast<double>(d.count()) / 1000.0 << " s";
  return s.str();
}

std::string list_text(const std::vector<int>& xs) {
  std::string s;
  for (int x : xs) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

// "e<epoch>/", built by appends (GCC 12 warns falsely on "e" + std::to_string(e) + ...).
std::string epoch_dir(uint64_t epoch) {
  std::string s = "e";
  s += std::to_string(epoch);
  s += '/';
  return s;
}

// "HOST:PID:NONCE": who a worker is, for messages about it (describe_process).
std::string new_token() {
  char host[64] = {};
  ::gethostname(host, sizeof host - 1);
  std::random_device rd;
  std::ostringstream s;
  s << host << ":" << ::getpid() << ":" << std::hex << ((uint64_t(rd()) << 32) | rd());
  return s.str();
}

// Polls from 1 ms up to `cap` apart: quick when the answer is near, cheap when it is not.
class Backoff {
 public:
  explicit Backoff(Ms cap) : cap_(cap) {}
  void pause() {
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, cap_);
  }

 private:
  Ms pause_{1}, cap_;
};

// The deadline of a wait on peers that a stop of this process does not use up: a gap between
// two checks longer than the ttl (SIGSTOP, or a starved process) starts the wait again, since
// what it knew of its peers is that old too. Without it, a worker let go after a stop past the
// timeout would find its wait over at once and decide alone (propose a view of itself only,
// evicting live islands that were about to be ready).
class WaitDeadline {
 public:
  WaitDeadline(Ms limit, Ms gap) : limit_(limit), gap_(gap), end_(Clock::now() + limit), last_(Clock::now()) {}
  bool passed() {
    const auto now = Clock::now();
    if (now - last_ > gap_) end_ = now + limit_;
    last_ = now;
    return now >= end_;
  }
  void extend_to(Clock::time_point t) { end_ = std::max(end_, t); }

 private:
  Ms limit_, gap_;
  Clock::time_point end_, last_;
};

}  // namespace

std::string outer_attempt(int64_t outer_step) {
  std::string s = "s";
  s += std::to_string(outer_step);
  return s;
}

bool View::contains(int island) const { return position(island) >= 0; }

bool View::is_joining(int island) const { return std::find(joining.begin(), joining.end(), island) != joining.end(); }

int View::position(int island) const {
  const auto it = std::find(islands.begin(), islands.end(), island);
  return it == islands.end() ? -1 : int(it - islands.begin());
}

std::vector<int> View::holders() const {
  std::vector<int> h;
  for (int i : islands)
    if (!is_joining(i)) h.push_back(i);
  return h;
}

std::string View::describe() const {
  std::string s = "epoch " + std::to_string(epoch) + ": islands " + list_text(islands);
  if (!joining.empty()) s += " (joining " + list_text(joining) + ")";
  return s;
}

std::string View::to_json() const {
  return json{{"epoch", epoch}, {"islands", islands}, {"joining", joining}, {"tokens", tokens}}.dump();
}

namespace {

[[noreturn]] void bad_record(const std::string& what, const std::string& problem, const std::string& text) {
  throw IoError("membership " + what + " in the store is not valid (" + problem + "): " + text.substr(0, 200) +
                "; fix: the store holds another run's or another build's keys: start the run with a fresh store");
}

// Island numbers as a view or round lists them: ascending, each once, non-negative.
std::vector<int> island_list(const json& j, const std::string& what, const std::string& text) {
  if (!j.is_array()) bad_record(what, "islands are not a list", text);
  std::vector<int> out;
  for (const json& i : j) {
    const bool ok = i.is_number_integer() && i.get<int64_t>() >= 0 && i.get<int64_t>() <= INT32_MAX &&
                    (out.empty() || i.get<int64_t>() > out.back());
    if (!ok) bad_record(what, "islands are not ascending numbers from 0", text);
    out.push_back(i.get<int>());
  }
  return out;
}

}  // namespace

View View::from_json(const std::string& text) {
  try {
    const json j = json::parse(text);
    View v;
    if (!j.at("epoch").is_number_unsigned()) bad_record("view", "epoch is not a number from 0", text);
    v.epoch = j.at("epoch").get<uint64_t>();
    v.islands = island_list(j.at("islands"), "view", text);
    v.joining = island_list(j.at("joining"), "view", text);
    v.tokens = j.at("tokens").get<std::map<std::string, std::string>>();
    for (int i : v.joining)
      if (!v.contains(i)) bad_record("view", "joining island " + std::to_string(i) + " is not one of its islands", text);
    return v;
  } catch (const json::exception& e) {
    bad_record("view", e.what(), text);
  }
}

Decision parse_decision(const std::string& text) {
  try {
    const json j = json::parse(text);
    Decision d{.commit = j.at("commit").get<bool>(), .why = j.value("why", ""), .next = std::nullopt};
    if (j.contains("next")) d.next = View::from_json(j["next"].dump());
    return d;
  } catch (const json::exception& e) {
    bad_record("decision", e.what(), text);
  }
}

std::vector<int> parse_round(const std::string& text) {
  try {
    return island_list(json::parse(text), "round", text);
  } catch (const json::exception& e) {
    bad_record("round", e.what(), text);
  }
}

uint64_t parse_epoch(const std::string& text) {
  uint64_t e = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), e);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) bad_record("epoch", "not a number", text);
  return e;
}

std::string Membership::worker_name(int island, int rank) { return std::to_string(island) + "." + std::to_string(rank); }

Membership::Membership(Store& store, const MembershipOptions& opts)
    : store_(store), opts_(opts), me_(worker_name(opts.island, opts.rank)), token_(new_token()) {
  ATOLL_CHECK(opts.ttl > opts.heartbeat) << "heartbeat ttl " << opts.ttl.count() << " ms, interval "
                                         << opts.heartbeat.count() << " ms";
}

Membership::~Membership() {
  {
    std::lock_guard<std::mutex> lock(beat_mu_);
    stop_ = true;
  }
  beat_cv_.notify_all();
  if (beat_.joinable()) {
    beat_.join();
    try {
      store_.erase_if_equal(key("hb/" + me_), token_);  // not a restarted worker's own heartbeat
    } catch (const Error&) {
      // the store is gone: the key expires on its own
    }
  }
}

std::string Membership::key(const std::string& rest) const { return store_.run_prefix() + "/members/" + rest; }

std::string Membership::attempt_key(uint64_t epoch, const std::string& attempt, const std::string& rest) const {
  return key(epoch_dir(epoch) + attempt + "/" + rest);
}

std::vector<std::string> Membership::worker_keys(const std::string& prefix, const std::vector<int>& islands) const {
  std::vector<std::string> keys;
  for (int i : islands)
    for (int r = 0; r < opts_.workers_per_island; ++r) keys.push_back(prefix + worker_name(i, r));
  return keys;
}

void Membership::start_heartbeat() {
  beat_store_ = std::make_unique<Store>(store_.options());
  store_.share_kept_keys_with(*beat_store_);  // the heartbeat notices a restart first: it writes them back
  claim_place();
  beat_ = std::thread([this] { heartbeat_loop(); });
}

void Membership::heartbeat_loop() {
  bool warned = false;
  std::unique_lock<std::mutex> lock(beat_mu_);
  while (!beat_cv_.wait_for(lock, opts_.heartbeat, [this] { return stop_; })) {
    lock.unlock();
    try {
      if (!place_taken_ && !beat_store_->set_with_ttl_if_free(key("hb/" + me_), token_, opts_.ttl)) {
        place_taken_ = true;  // for good: this worker is out of the run, and must not come back in its place
        log_warn("worker " + me_ + ": its place was taken by " +
                 describe_process(beat_store_->get(key("hb/" + me_)).value_or("")) +
                 " after this worker's heartbeat lapsed (stopped or starved past fault.heartbeat_ttl_s); it is out of "
                 "the run and no longer writes its heartbeat");
      }
      warned = false;
    } catch (const Error& e) {  // the store is away: peers will count this worker lost; keep trying
      if (!warned) log_warn("worker " + me_ + ": heartbeat not written: " + e.what());
      warned = true;
    }
    lock.lock();
  }
}

void Membership::announce() { store_.set(key("e0/ready/" + me_), token_); }

View Membership::initial_view() {
  View v;
  for (int i = 0; i < opts_.islands; ++i) v.islands.push_back(i);
  const std::vector<std::string> keys = worker_keys(key("e0/ready/"), v.islands);
  store_.wait(keys, opts_.timeout);
  const auto tokens = store_.get_many(keys);
  for (size_t k = 0; k < keys.size(); ++k) v.tokens[keys[k].substr(keys[k].rfind('/') + 1)] = tokens[k].value_or("");
  return publish(v);
}

bool Membership::store_settling() {
  std::lock_guard<std::mutex> lock(settle_mu_);  // alive() is also asked from an exchange's thread
  const uint64_t n = store_.reconnections();
  if (n != reconnections_seen_) {
    reconnections_seen_ = n;
    settled_at_ = Clock::now() + opts_.ttl;
    log_warn("worker " + me_ + ": the store connection was lost and is back (a restarted store?); judging liveness "
             "again in " + seconds_text(opts_.ttl) + ", once the live workers' heartbeats are back");
  }
  return Clock::now() < settled_at_;
}

std::vector<bool> Membership::alive(const View& v) {
  const std::vector<std::string> keys = worker_keys(key("hb/"), v.islands);
  auto beats = store_.get_many(keys);
  while (store_settling()) {
    std::this_thread::sleep_for(Ms(20));
    beats = store_.get_many(keys);
  }
  const size_t M = size_t(opts_.workers_per_island);
  std::vector<bool> out(v.islands.size(), true);
  for (size_t k = 0; k < keys.size(); ++k) {
    const auto it = v.tokens.find(keys[k].substr(keys[k].rfind('/') + 1));
    if (!beats[k] || it == v.tokens.end() || *beats[k] != it->second) out[k / M] = false;
  }
  return out;
}

bool Membership::all_alive(const View& v) {
  const std::vector<bool> a = alive(v);
  return std::all_of(a.begin(), a.end(), [](bool x) { return x; });
}

std::vector<int> Membership::waiting_joiners(const View& v, std::map<std::string, std::string>* tokens) {
  std::vector<int> outside;
  for (int i = 0; i < opts_.islands; ++i)
    if (!v.contains(i)) outside.push_back(i);
  if (outside.empty()) return {};
  const std::vector<std::string> joins = worker_keys(key("join/"), outside);
  const std::vector<std::string> beats = worker_keys(key("hb/"), outside);
  std::vector<std::string> both = joins;
  both.insert(both.end(), beats.begin(), beats.end());
  const auto values = store_.get_many(both);
  const size_t M = size_t(opts_.workers_per_island);
  std::vector<int> waiting;
  for (size_t j = 0; j < outside.size(); ++j) {
    bool all = true;
    for (size_t r = 0; r < M; ++r) {
      const auto& join = values[j * M + r];
      const auto& beat = values[joins.size() + j * M + r];
      all = all && join && beat && *join == *beat;
    }
    if (!all) continue;
    waiting.push_back(outside[j]);
    for (size_t r = 0; r < M; ++r) (*tokens)[worker_name(outside[j], int(r))] = *values[j * M + r];
  }
  return waiting;
}

View Membership::publish(const View& proposal) {
  const std::string k = key("view/e" + std::to_string(proposal.epoch));
  if (store_.set_if_absent(k, proposal.to_json())) store_.set(key("epoch"), std::to_string(proposal.epoch));
  const std::string won = store_.get(k).value();
  store_.keep("view", k, won);
  store_.keep("epoch", key("epoch"), std::to_string(proposal.epoch));
  return View::from_json(won);
}

std::optional<View> Membership::view(uint64_t epoch) {
  const auto text = store_.get(key("view/e" + std::to_string(epoch)));
  if (!text) return std::nullopt;
  return View::from_json(*text);
}

Decision Membership::decide(const View& v, const std::string& attempt, bool ok, bool admit) {
  const std::string decision_key = attempt_key(v.epoch, attempt, "decision");
  const std::string vote_key = attempt_key(v.epoch, attempt, "vote/" + me_);
  // A failure decides before it votes, so a peer that reads the "fail" vote finds this
  // decision already written (and every worker reads the same reason).
  if (!ok) store_.set_if_absent(decision_key, json{{"commit", false}, {"why", "worker " + me_ + " failed"}}.dump());
  store_.set(vote_key, ok ? "ok" : "fail");
  store_.keep("vote", vote_key, ok ? "ok" : "fail");
  const std::vector<std::string> votes_keys = worker_keys(attempt_key(v.epoch, attempt, "vote/"), v.islands);
  const std::vector<std::string> beat_keys = worker_keys(key("hb/"), v.islands);
  WaitDeadline deadline(opts_.timeout, opts_.ttl);
  Backoff backoff(Ms(10));
  for (;;) {
    if (const auto d = store_.get(decision_key)) {
      store_.keep("decision", decision_key, *d);  // a peer still deciding after a store restart reads it
      Decision out = parse_decision(*d);
      if (out.next) out.next = publish(*out.next);  // idempotent
      return out;
    }
    const auto votes = store_.get_many(votes_keys);
    const auto beats = store_.get_many(beat_keys);
    std::string failed, pending;
    for (size_t k = 0; k < votes_keys.size(); ++k) {
      const std::string name = votes_keys[k].substr(votes_keys[k].rfind('/') + 1);
      const auto token = v.tokens.find(name);
      const bool live = beats[k] && token != v.tokens.end() && *beats[k] == token->second;
      if (votes[k] && *votes[k] == "fail") failed += (failed.empty() ? "" : ", ") + name;
      else if (!votes[k] && live) pending += (pending.empty() ? "" : ", ") + name;
    }
    const bool timed_out = deadline.passed();  // after the reads: a stop during them restarts the wait
    // The store restarted: the votes and the decision come back from the workers that hold them.
    if (store_settling()) {
      deadline.extend_to(settled_at_ + opts_.timeout);
      backoff.pause();
      continue;
    }
    json decision;
    if (!failed.empty()) {
      decision = {{"commit", false}, {"why", "worker(s) " + failed + " failed"}};
    } else if (!pending.empty() && timed_out) {
      decision = {{"commit", false},
                  {"why", "no vote from worker(s) " + pending + " within " + seconds_text(opts_.timeout)}};
    } else if (pending.empty()) {
      decision = {{"commit", true}};
      std::map<std::string, std::string> tokens = v.tokens;
      const std::vector<int> joiners = admit ? waiting_joiners(v, &tokens) : std::vector<int>{};
      if (!joiners.empty()) {
        View next{.epoch = v.epoch + 1, .islands = v.islands, .joining = joiners, .tokens = tokens};
        next.islands.insert(next.islands.end(), joiners.begin(), joiners.end());
        std::sort(next.islands.begin(), next.islands.end());
        decision["next"] = json::parse(next.to_json());
      }
    } else {
      backoff.pause();
      continue;
    }
    store_.set_if_absent(decision_key, decision.dump());  // the first decision stands; read it back
  }
}

View Membership::reform(const View& v, const std::vector<int>& joining, const std::vector<int>& left_out) {
  const uint64_t next = v.epoch + 1;
  const std::string ready_prefix = key(epoch_dir(next) + "ready/");
  store_.set(ready_prefix + me_, token_);
  store_.keep("ready", ready_prefix + me_, token_);
  const std::vector<std::string> ready_keys = worker_keys(ready_prefix, v.islands);
  const std::vector<std::string> beat_keys = worker_keys(key("hb/"), v.islands);
  const size_t M = size_t(opts_.workers_per_island);
  WaitDeadline deadline(opts_.timeout, opts_.ttl);
  Backoff backoff(Ms(10));
  for (;;) {
    if (const auto w = view(next)) {
      store_.keep("view", key("view/e" + std::to_string(next)), w->to_json());
      return *w;
    }
    const auto ready = store_.get_many(ready_keys);
    const auto beats = store_.get_many(beat_keys);
    if (store_settling()) {  // the ready marks and heartbeats come back from the live workers
      deadline.extend_to(settled_at_ + opts_.timeout);
      backoff.pause();
      continue;
    }
    View proposal{.epoch = next, .islands = {}, .joining = {}, .tokens = {}};
    bool pending = false;
    auto keep = [&](size_t j) {
      proposal.islands.push_back(v.islands[j]);
      if (std::find(joining.begin(), joining.end(), v.islands[j]) != joining.end())
        proposal.joining.push_back(v.islands[j]);
      for (size_t r = 0; r < M; ++r) {
        const std::string name = worker_name(v.islands[j], int(r));
        proposal.tokens[name] = v.tokens.at(name);
      }
    };
    std::vector<size_t> late_ready_holders;  // left out by this worker, yet ready: alive and here
    for (size_t j = 0; j < v.islands.size(); ++j) {
      bool all_ready = true, lost = false;
      for (size_t r = 0; r < M; ++r) {
        const size_t k = j * M + r;
        const std::string name = worker_name(v.islands[j], int(r));
        const auto token = v.tokens.find(name);
        const std::string want = token == v.tokens.end() ? std::string() : token->second;
        all_ready = all_ready && ready[k] && *ready[k] == want;
        lost = lost || !beats[k] || *beats[k] != want;
      }
      const bool late = std::find(left_out.begin(), left_out.end(), v.islands[j]) != left_out.end();
      const bool holder = std::find(joining.begin(), joining.end(), v.islands[j]) == joining.end();
      if (all_ready && !late) {
        keep(j);
      } else if (!lost && !late) {
        pending = true;
      } else if (late && holder && all_ready) {
        late_ready_holders.push_back(j);
      }
    }
    // A view without an island that holds the run's state ends the run. So where this worker
    // left out every holder as late (it judged them gone before the group formed while they
    // lived: seen once in the 1,205-event chaos run, docs/benchmarks.md), the holders that are
    // ready for this epoch (alive, re-forming with us) are kept after all.
    if (proposal.holders().empty() && !late_ready_holders.empty()) {
      for (const size_t j : late_ready_holders) keep(j);
      std::sort(proposal.islands.begin(), proposal.islands.end());
      std::sort(proposal.joining.begin(), proposal.joining.end());
    }
    // Never a view without a holder where the old view had one: such a view ends the run for
    // every island, holders included (they read that they are no longer members). Holders that
    // only look gone (starved on a loaded host: lapsed heartbeats, judged late) are waited for up
    // to the timeout; then the proposal is returned unpublished, and its joiners leave the run to
    // rejoin when a holder is back (ElasticGroup::reform). Seen in the chaos runs at load 20.
    const bool holderless = proposal.holders().empty() && !v.holders().empty();
    if (holderless) pending = true;
    if (!pending) return publish(proposal);
    if (deadline.passed()) return holderless ? proposal : publish(proposal);
    backoff.pause();
  }
}

Membership::Round Membership::arrive(const View& v, const std::string& attempt, Ms deadline) {
  store_.set(attempt_key(v.epoch, attempt, "arrived/" + me_), token_);
  store_.keep("arrived", attempt_key(v.epoch, attempt, "arrived/" + me_), token_);  // back after a store restart
  const std::string round_key = attempt_key(v.epoch, attempt, "round");
  const std::vector<std::string> arrived_keys = worker_keys(attempt_key(v.epoch, attempt, "arrived/"), v.islands);
  const std::vector<std::string> beat_keys = worker_keys(key("hb/"), v.islands);
  const size_t M = size_t(opts_.workers_per_island);
  const auto start = Clock::now();
  auto waited = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  Backoff backoff(Ms(10));
  for (;;) {
    if (const auto r = store_.get(round_key)) {
      store_.keep("round", round_key, *r);
      return {.islands = parse_round(*r), .closed = true, .closed_here = false,
              .waited_s = waited()};
    }
    const auto arrived = store_.get_many(arrived_keys);
    const auto beats = store_.get_many(beat_keys);
    std::vector<int> in;
    bool late_alive = false;
    for (size_t j = 0; j < v.islands.size(); ++j) {
      bool all_arrived = true, lost = false;
      for (size_t r = 0; r < M; ++r) {
        const size_t k = j * M + r;
        const auto token = v.tokens.find(worker_name(v.islands[j], int(r)));
        const std::string want = token == v.tokens.end() ? std::string() : token->second;
        all_arrived = all_arrived && arrived[k] && *arrived[k] == want;
        lost = lost || !beats[k] || *beats[k] != want;
      }
      if (all_arrived) in.push_back(v.islands[j]);
      else if (!lost) late_alive = true;
    }
    const bool everyone = in.size() == v.islands.size();
    if (!everyone && !late_alive)
      return {.islands = v.islands, .closed = false, .closed_here = false, .waited_s = waited()};
    if (everyone || Clock::now() - start >= deadline) {
      const bool mine = store_.set_if_absent(round_key, json(in).dump());
      const std::string round = store_.get(round_key).value();
      store_.keep("round", round_key, round);  // every worker holds the round it read
      Round out{.islands = parse_round(round), .closed = true, .closed_here = mine,
                .waited_s = waited()};
      return out;
    }
    backoff.pause();
  }
}

void Membership::request_join() {
  store_.set(key("join/" + me_), token_);
  store_.keep("join", key("join/" + me_), token_);
}

void Membership::withdraw_join() {
  store_.forget("join");
  store_.erase_if_equal(key("join/" + me_), token_);
}

std::optional<View> Membership::wait_admission(Clock::time_point until) {
  const auto epoch_now = [&]() -> std::optional<uint64_t> {
    const auto e = store_.get(key("epoch"));
    if (!e) return std::nullopt;
    return parse_epoch(*e);
  };
  std::optional<uint64_t> from = epoch_now();
  auto lonely_since = Clock::now();
  for (;;) {
    if (done()) return std::nullopt;
    const std::optional<uint64_t> newest = epoch_now();
    if (newest) {
      // Newest first: an admission that was re-formed meanwhile lives on in the later view.
      for (uint64_t e = *newest + 1; e-- > from.value_or(0);) {
        const std::optional<View> w = view(e);
        if (!w || !w->is_joining(opts_.island) || (admitted_ && e <= *admitted_)) continue;
        const auto t = w->tokens.find(me_);
        if (t == w->tokens.end() || t->second != token_) continue;
        admitted_ = e;
        return w;
      }
      from = *newest;
      const std::optional<View> latest = view(*newest);
      const std::vector<bool> a = latest ? alive(*latest) : std::vector<bool>{};
      if (std::any_of(a.begin(), a.end(), [](bool x) { return x; })) lonely_since = Clock::now();
    }
    if (Clock::now() >= until)
      throw Timeout("worker " + me_ + ": not admitted to the run before fault.rejoin_timeout_s ran out (no committed "
                    "outer step admitted it: its island's other ranks may be missing)");
    if (Clock::now() - lonely_since > opts_.timeout)
      throw Error("worker " + me_ + ": no island of the run has been alive for " + seconds_text(opts_.timeout) +
                  ", so there is nothing to rejoin; fix: resume the run from its newest checkpoint "
                  "(`atoll launch --resume --run-dir DIR`)");
    std::this_thread::sleep_for(Ms(20));
  }
}

void Membership::put_record(const std::string& record) {
  store_.set(key("record/" + me_), record);
  store_.keep("record", key("record/" + me_), record);
}

std::optional<std::string> Membership::record(int island, int rank) {
  return store_.get(key("record/" + worker_name(island, rank)));
}

void Membership::mark_done() {
  store_.set(key("done"), "1");
  store_.keep("done", key("done"), "1");
}

bool Membership::done() { return store_.get(key("done")).has_value(); }

void Membership::put_config(const std::string& text) {
  store_.set_if_absent(key("config"), text);
  store_.keep("config", key("config"), text);
}

std::optional<std::string> Membership::config() { return store_.get(key("config")); }

}  // namespace atl
