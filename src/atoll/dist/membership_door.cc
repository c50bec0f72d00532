// Who may enter a run (see membership.h, "Trust at the door" and "One process per place"): the
// run's token, a joiner's run on the store, and the claim of a worker's place by its heartbeat.
#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/dist/membership.h"
#include "atoll/dist/run_token.h"
#include "atoll/dist/seal.h"

namespace atl {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

// How often the door's waits look again: well below a heartbeat, cheap for the store.
constexpr Ms kPoll{20};

// Equal strings, in a time that does not depend on where they first differ.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(1, b.size())]);
  return diff == 0;
}

// The ids of the other runs on the store: those with a token or a membership epoch there.
std::vector<std::string> runs_on_store(Store& store) {
  std::set<std::string> ids;
  const std::string prefix = "atoll/", members = "/members/";
  for (const char* what : {"run_token", "epoch"})
    for (const std::string& k : store.scan(prefix + "*" + members + what))
      if (const size_t end = k.rfind(members); end > prefix.size()) ids.insert(k.substr(prefix.size(), end - prefix.size()));
  ids.erase(store.options().run_id);
  return {ids.begin(), ids.end()};
}

// "run 'a'", "runs 'a', 'b'" (the first five, then how many more).
std::string runs_text(const std::vector<std::string>& ids) {
  std::string s = ids.size() == 1 ? "run " : "runs ";
  for (size_t i = 0; i < ids.size() && i < 5; ++i) s += (i ? ", '" : "'") + ids[i] + "'";
  if (ids.size() > 5) s += " and " + std::to_string(ids.size() - 5) + " more";
  return s;
}

// Where a worker finds the id of a launched run, for the fixes of messages that name a run.
constexpr const char* kRunIdFix = "--run-dir RUN_DIR (a launched run's id is in RUN_DIR/run.id) or --run-id ID";

}  // namespace

// "pid 1234, host h" for a token Membership made ("HOST:PID:NONCE"); "a process of unknown
// origin" for anything else.
std::string describe_process(const std::string& token) {
  const size_t nonce = token.rfind(':');
  const size_t pid = nonce == std::string::npos || nonce == 0 ? std::string::npos : token.rfind(':', nonce - 1);
  const std::string digits = pid == std::string::npos ? "" : token.substr(pid + 1, nonce - pid - 1);
  if (digits.empty() || digits.size() > 10 || digits.find_first_not_of("0123456789") != std::string::npos || pid > 255)
    return "a process of unknown origin";
  return "pid " + digits + ", host " + token.substr(0, pid);
}

// The store holds the token's verifier (seal.h), never the token: the sealing keys come from it.
void publish_run_token(Store& store, const std::string& token) {
  ATOLL_CHECK(!token.empty());
  const std::string key = store.run_prefix() + "/members/run_token";
  const std::string verifier = run_token_verifier(token);
  if (!store.set_if_absent(key, verifier) && !same_secret(store.get(key).value_or(""), verifier))
    throw ConfigError(store.url() + ": run id '" + store.options().run_id + "' already has another run token; fix: a "
                      "fresh run id per run");
}

RunTokenVerdict judge_run_token(Store& store, const std::string& token) {
  using Kind = RunTokenVerdict::Kind;
  const std::string prefix = store.run_prefix() + "/members/";
  const auto found = store.get_many({prefix + "run_token", prefix + "epoch"});
  const std::string verifier = token.empty() ? std::string() : run_token_verifier(token);  // what the store holds
  if (found[0]) {
    if (token.empty()) return {.kind = Kind::kNoneGiven};
    return {.kind = same_secret(*found[0], verifier) ? Kind::kMatches : Kind::kWrong};
  }
  if (found[1]) return {.kind = Kind::kRunWithoutToken};
  if (!token.empty())
    for (const std::string& other : runs_on_store(store))
      if (const auto t = store.get("atoll/" + other + "/members/run_token"); t && same_secret(*t, verifier))
        return {.kind = Kind::kOtherRuns, .other_run = other};
  return {.kind = Kind::kNewRun};
}

void Membership::check_run_token() {
  const std::string k = key("run_token");
  std::optional<std::string> stored = store_.get(k);
  if (!stored && !store_.get(key("epoch"))) check_new_run();
  const std::string verifier = opts_.run_token.empty() ? std::string() : run_token_verifier(opts_.run_token);
  if (!stored && !opts_.run_token.empty()) {  // a run started by hand: the first token stands
    store_.set_if_absent(k, verifier);
    stored = store_.get(k);
  }
  if (!stored) return;
  if (same_secret(*stored, verifier)) store_.keep("run_token", k, verifier);
  const std::string fix = "; nothing in the run was changed; fix: give the run's token with --token-file "
                          "RUN_DIR/run.token (written by `atoll launch`, mode 0600) or ATOLL_RUN_TOKEN";
  if (opts_.run_token.empty())
    throw ConfigError("worker " + me_ + ": refused: run '" + store_.options().run_id + "' requires its run token and none "
                      "was given" + fix);
  if (!same_secret(*stored, verifier))
    throw ConfigError("worker " + me_ + ": refused: the run token given is not the token of run '" +
                      store_.options().run_id + "'" + fix);
}

// This worker founds run `run_id`, which is not on the store yet. A token that is another run's
// there means the run id is wrong: refused, naming that run. Otherwise the worker may be the first
// of a run started by hand, or have a wrong token and a wrong run id: it cannot tell, so it says
// which runs the store holds and goes on.
void Membership::check_new_run() {
  const std::string& id = store_.options().run_id;
  const std::vector<std::string> others = runs_on_store(store_);
  if (others.empty()) return;
  const std::string verifier = opts_.run_token.empty() ? std::string() : run_token_verifier(opts_.run_token);
  for (const std::string& other : others) {
    const std::optional<std::string> token = store_.get("atoll/" + other + "/members/run_token");
    if (!opts_.run_token.empty() && token && same_secret(*token, verifier))
      throw ConfigError("worker " + me_ + ": refused: run '" + id + "' is not on " + store_.url() +
                        ", and the token given is run '" + other + "''s; nothing in either run was changed; fix: "
                        "join that run with --run-dir RUN_DIR (its id is in RUN_DIR/run.id) or --run-id " + other +
                        " (a new run needs a token of its own)");
  }
  log_warn("worker " + me_ + ": run '" + id + "' is new on " + store_.url() + ": this worker starts it and waits for "
           "its peers; the store also holds " + runs_text(others) + " (to join one: " + kRunIdFix + ")");
}

void Membership::expect_run() {
  const auto until = Clock::now() + opts_.ttl;
  for (;;) {
    const auto found = store_.get_many({key("run_token"), key("epoch")});
    if (found[0] || found[1]) return;
    if (Clock::now() >= until) break;
    std::this_thread::sleep_for(kPoll);
  }
  const std::vector<std::string> others = runs_on_store(store_);
  throw ConfigError("worker " + me_ + ": refused: --join, but run '" + store_.options().run_id + "' is not on " +
                    store_.url() + " (no token and no membership view there" +
                    (others.empty() ? std::string() : "; the store holds " + runs_text(others)) +
                    "); nothing was written; fix: name the run with " + kRunIdFix);
}

// See "One process per place" in membership.h: a heartbeat whose expiry moves (or whose token
// changes) between two reads was rewritten by a live process; one that stays put lapses.
void Membership::claim_place() {
  const std::string k = key("hb/" + me_);
  std::optional<Store::Expiring> seen;
  const auto give_up = Clock::now() + opts_.timeout;
  while (!beat_store_->set_with_ttl_if_free(k, token_, opts_.ttl)) {
    const std::optional<Store::Expiring> now = beat_store_->get_expiring(k);
    if (!now) continue;  // lapsed since: claim again
    const bool rewritten = seen && (now->value != seen->value || now->expires_at_ms != seen->expires_at_ms);
    if (rewritten || now->expires_at_ms < 0)  // a key that never expires is no dead worker's either
      throw ConfigError("worker " + me_ + ": refused: island " + std::to_string(opts_.island) + " rank " +
                        std::to_string(opts_.rank) + " is running (" + describe_process(now->value) + "): its "
                        "heartbeat in run '" + store_.options().run_id + "' is current; nothing in the run was changed; "
                        "fix: stop that process first, or start this one as another island or rank (a restarted "
                        "worker takes the place of a dead one once its heartbeat lapses, within fault.heartbeat_ttl_s)");
    seen = now;
    if (Clock::now() >= give_up)
      throw Timeout("worker " + me_ + ": the heartbeat of " + describe_process(now->value) + " in this worker's place "
                    "neither lapsed nor was rewritten within fault.timeout_s");
    std::this_thread::sleep_for(kPoll);
  }
}

}  // namespace atl
