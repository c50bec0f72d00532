// Membership in the store, with real processes: heartbeats show who is alive and a lost worker
// expires (a restarted one with a new token does not revive it); every worker gets the same
// decision for an attempt (commit, abort on any failure, commit when the only silent worker is
// lost); re-forming keeps the ready islands, waits for a slow one and drops the lost one; a
// restarted worker is admitted by the next commit and sees the run end; a worker with a wrong or
// missing run token is refused and writes nothing; a worker let go after a stop in reform waits
// again rather than deciding alone; a second process in a live worker's place is refused naming
// it, while a stopped (or dead) one's place is taken within the ttl and not taken back; another
// run's token, and a joiner of a run that is not on the store, are refused at once.
#include "atoll/dist/membership.h"
#include "atoll/dist/seal.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

#include "dist_test_util.h"

namespace atl {
namespace {

using std::chrono::milliseconds;
using testing::run_processes;
using Clock = std::chrono::steady_clock;

class MembershipTest : public testing::RedisSuite {
 protected:
  static MembershipOptions options(int island, int islands) {
    return {.island = island, .rank = 0, .islands = islands, .workers_per_island = 1, .heartbeat = milliseconds(50),
            .ttl = milliseconds(400), .timeout = milliseconds(15000)};
  }
};

// Polls `cond` until true or 10 s; returns whether it became true.
template <class Cond>
bool eventually(Cond&& cond) {
  const auto end = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return false;
}

// The state letter of a process ('T': stopped), from /proc/PID/stat.
char process_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

std::string alive_text(const std::vector<bool>& a) {
  std::string s;
  for (bool x : a) s += x ? '1' : '0';
  return s;
}

TEST_F(MembershipTest, HeartbeatsShowWhoIsAliveAndALostWorkerExpires) {
  const auto out = run_processes(3, [&](int island) {
    Store store(store_options("alive"));
    Membership m(store, options(island, 3));
    m.start_heartbeat();
    m.announce();
    const View v = m.initial_view();
    const std::string flags = store.run_prefix() + "/test/";
    if (island == 2) {  // killed once both others have seen it alive: its key stays until the ttl passes
      store.wait({flags + "seen0", flags + "seen1"});
      ::raise(SIGKILL);
    }
    std::string seen = alive_text(m.alive(v));
    store.set(flags + "seen" + std::to_string(island), "1");
    bool others_stayed = true;
    const bool expired = eventually([&] {
      const std::vector<bool> a = m.alive(v);
      others_stayed = others_stayed && a[0] && a[1];
      return !a[2];
    });
    if (island == 0) {  // a restarted island 2 (a new token) is not the member of view v
      Membership again(store, options(2, 3));
      again.start_heartbeat();
      seen += " restarted:" + std::to_string(m.alive(v)[2]);
    }
    store.set(flags + "done" + std::to_string(island), "1");  // neither leaves before the other has looked
    store.wait({flags + "done0", flags + "done1"});
    return v.to_json() + "|" + seen + "|expired=" + std::to_string(expired) + "|stayed=" + std::to_string(others_stayed);
  }, std::chrono::seconds(60), {2});
  EXPECT_EQ(out[2], "DIED");
  const std::string view = out[0].substr(0, out[0].find('|'));
  EXPECT_NE(view.find("\"islands\":[0,1,2]"), std::string::npos) << view;
  EXPECT_EQ(out[1].substr(0, view.size()), view) << "every worker holds the same initial view";
  for (int i = 0; i < 2; ++i) EXPECT_NE(out[i].find("|111"), std::string::npos) << out[i];
  for (int i = 0; i < 2; ++i) EXPECT_NE(out[i].find("expired=1|stayed=1"), std::string::npos) << out[i];
  EXPECT_NE(out[0].find("restarted:0"), std::string::npos) << out[0];
}

TEST_F(MembershipTest, EveryWorkerGetsTheSameDecision) {
  const auto out = run_processes(3, [&](int island) {
    Store store(store_options("decide"));
    auto m = std::make_unique<Membership>(store, options(island, 3));
    m->start_heartbeat();
    m->announce();
    const View v = m->initial_view();
    std::string r;
    const Decision all_ok = m->decide(v, "s1", true, false);
    r += all_ok.commit ? "commit " : "abort ";
    const Decision one_failed = m->decide(v, "s2", island != 1, false);
    r += (one_failed.commit ? "commit" : "abort") + std::string("(") + one_failed.why + ") ";
    if (island == 2) {
      m.reset();  // leaves cleanly: its heartbeat key goes at once, and it votes no more
      return r;
    }
    const Decision without_lost = m->decide(v, "s3", true, false);
    return r + (without_lost.commit ? "commit" : "abort");
  });
  EXPECT_EQ(out[2], "commit abort(worker 1.0 failed) ");
  for (int i = 0; i < 2; ++i) EXPECT_EQ(out[i], "commit abort(worker 1.0 failed) commit") << i;
}

TEST_F(MembershipTest, ReformKeepsTheReadyIslandsWaitsForASlowOneAndDropsTheLostOne) {
  const auto out = run_processes(3, [&](int island) {
    Store store(store_options("reform"));
    auto m = std::make_unique<Membership>(store, options(island, 3));
    m->start_heartbeat();
    m->announce();
    const View v = m->initial_view();
    if (island == 2) {
      m.reset();
      return std::string("left");
    }
    // Island 1 marks itself ready only after island 0 has: island 0 must wait for it.
    if (island == 1) store.wait({store.run_prefix() + "/members/e1/ready/0.0"});
    const View next = m->reform(v, {});
    return next.to_json();
  });
  EXPECT_EQ(out[2], "left");
  EXPECT_EQ(out[0], out[1]);
  EXPECT_NE(out[0].find("\"epoch\":1"), std::string::npos) << out[0];
  EXPECT_NE(out[0].find("\"islands\":[0,1]"), std::string::npos) << out[0];
}

// A worker stopped (SIGSTOP) while it waits in reform, past the timeout, and let go: its wait
// starts again instead of being over at once, so it does not propose a view of itself alone
// while a live island is about to be ready.
TEST_F(MembershipTest, AWorkerLetGoAfterAStopInReformDoesNotDecideAlone) {
  const auto out = run_processes(2, [&](int island) {
    Store store(store_options("stopped-reform"));
    MembershipOptions o = options(island, 2);
    o.timeout = milliseconds(1500);
    Membership m(store, o);
    m.start_heartbeat();
    m.announce();
    const View v = m.initial_view();
    const std::string pid_key = store.run_prefix() + "/test/pid1";
    if (island == 1) {
      store.set(pid_key, std::to_string(::getpid()));
      std::thread stopper([&] {  // stops this whole process once it waits in reform
        store.wait({store.run_prefix() + "/members/e1/ready/1.0"});
        ::raise(SIGSTOP);
      });
      const View next = m.reform(v, {});
      stopper.join();
      return next.to_json();
    }
    store.wait({pid_key});
    const pid_t other = pid_t(std::stol(store.get(pid_key).value()));
    if (other <= 0) return std::string("no pid");  // never kill(-1): that signals every process
    const bool stopped = eventually([&] { return process_state(other) == 'T'; });
    std::this_thread::sleep_for(milliseconds(2500));  // past island 1's timeout
    ::kill(other, SIGCONT);
    std::this_thread::sleep_for(milliseconds(300));  // island 1 looks again: island 0 is alive, not ready
    const View next = m.reform(v, {});
    return std::string(stopped ? "" : "never stopped ") + next.to_json();
  });
  EXPECT_EQ(out[0], out[1]);
  EXPECT_NE(out[0].find("\"islands\":[0,1]"), std::string::npos) << out[0];
}

// A re-forming whose only ready island is a joiner waits for a holder of the run's state whose
// heartbeat lapsed (stopped past the ttl here; a starved worker on a loaded host in the chaos
// test) rather than proposing a view that holds no state and ends the run. Island 1 is being
// admitted; island 0, the holder, is stopped while island 1 waits in reform and let go.
TEST_F(MembershipTest, AReformWaitsForALapsedHolderRatherThanLeaveOnlyAJoiner) {
  const auto out = run_processes(3, [&](int p) {
    Store store(store_options("holder-lapsed"));
    const std::string flag = store.run_prefix() + "/test/";
    if (p == 2) {  // the controller: stops island 0 once island 1 waits, past the ttl, then lets it go
      store.wait({flag + "pid0", store.run_prefix() + "/members/e1/ready/1.0"});
      const pid_t holder = pid_t(std::stol(store.get(flag + "pid0").value()));
      if (holder <= 0) return std::string("no pid");  // never kill(-1)
      ::kill(holder, SIGSTOP);
      std::this_thread::sleep_for(milliseconds(1200));  // 3 x the ttl
      ::kill(holder, SIGCONT);
      store.set(flag + "let-go", "1");
      return std::string("controller");
    }
    Membership m(store, options(p, 2));
    m.start_heartbeat();
    m.announce();
    const View v = m.initial_view();
    if (p == 0) {
      store.set(flag + "pid0", std::to_string(::getpid()));
      store.wait({flag + "let-go"});
    }
    return m.reform(v, {1}).describe();
  });
  EXPECT_EQ(out[2], "controller");
  EXPECT_EQ(out[0], "epoch 1: islands 0, 1 (joining 1)");
  EXPECT_EQ(out[1], out[0]);
}

// A joiner that left out the holder as late (it judged it gone before the group formed) while
// the holder lives and re-forms too keeps it after all: a view of the joiner alone would hold
// no state and end the run (the 1,205-event chaos run, seed 33). Island 1 is being admitted
// and re-forms only once island 0, the holder, is ready for the next epoch.
TEST_F(MembershipTest, AReformNeverLeavesOutEveryHolderThatIsReady) {
  const auto out = run_processes(2, [&](int p) {
    Store store(store_options("late-holder"));
    Membership m(store, options(p, 2));
    m.start_heartbeat();
    m.announce();
    const View v = m.initial_view();
    const std::string flag = store.run_prefix() + "/test/";
    if (p == 0) {  // ready for epoch 1 (as reform marks it), then reads the view island 1 proposed
      store.set(store.run_prefix() + "/members/e1/ready/0.0", v.tokens.at("0.0"));
      store.set(flag + "ready0", "1");
      store.wait({flag + "decided1"});
      return m.reform(v, {1}).describe();
    }
    store.wait({flag + "ready0"});
    const std::string seen = m.reform(v, {1}, {0}).describe();
    store.set(flag + "decided1", "1");
    return seen;
  });
  EXPECT_EQ(out[1], "epoch 1: islands 0, 1 (joining 1)");
  EXPECT_EQ(out[0], out[1]);
}

// A joiner that finds no holder (here: the only holder is judged late and its heartbeat lapsed,
// as a starved process's does) never publishes a view of joiners alone, which would end the run
// for the holder too: it waits the timeout, then gets the view back unpublished (and leaves).
TEST_F(MembershipTest, AViewOfJoinersAloneIsNeverPublished) {
  const auto out = run_processes(2, [&](int p) {
    Store store(store_options("no-holder"));
    MembershipOptions o = options(p, 2);
    o.timeout = milliseconds(1500);
    auto m = std::make_unique<Membership>(store, o);
    m->start_heartbeat();
    m->announce();
    const View v = m->initial_view();
    const std::string flag = store.run_prefix() + "/test/";
    if (p == 0) {  // the holder stops beating (a starved or stopped process) and waits
      m.reset();
      store.set(flag + "gone0", "1");
      store.wait({flag + "reformed1"});
      return std::string(store.get(store.run_prefix() + "/members/view/e1") ? "published" : "none");
    }
    store.wait({flag + "gone0"});
    const auto t0 = Clock::now();
    const View seen = m->reform(v, {1}, {0});
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    store.set(flag + "reformed1", "1");
    return seen.describe() + (waited >= 1.0 ? " after the timeout" : " at once") +
           (m->view(1) ? " published" : " unpublished");
  });
  EXPECT_EQ(out[1], "epoch 1: islands 1 (joining 1) after the timeout unpublished");
  EXPECT_EQ(out[0], "none");
}

TEST_F(MembershipTest, ARestartedWorkerIsAdmittedByTheNextCommitAndSeesTheRunEnd) {
  const auto out = run_processes(3, [&](int island) {
    Store store(store_options("join"));
    const std::string flag = store.run_prefix() + "/test/";
    auto m = std::make_unique<Membership>(store, options(island, 3));
    m->start_heartbeat();
    m->announce();
    View v = m->initial_view();
    if (island == 2) {
      m.reset();  // lost, then restarted: a new process would get a new token; so does a new object
      store.set(flag + "left", "1");
      Membership again(store, options(2, 3));
      again.start_heartbeat();
      again.request_join();
      const std::optional<View> admitted = again.wait_admission();
      store.set(flag + "admitted", "1");
      const std::optional<View> after_end = again.wait_admission();  // the run is over: nothing
      return (admitted ? admitted->to_json() : std::string("none")) + "|" + (after_end ? "view" : "done");
    }
    store.wait({flag + "left"});
    v = m->reform(v, {});  // epoch 1: islands 0 and 1
    std::string r = v.describe();
    for (int k = 1; k <= 2000; ++k) {  // outer steps until one admits island 2
      const Decision d = m->decide(v, outer_attempt(k), true, true);
      if (!d.commit) return r + " abort?";
      if (d.next) {
        r += " | ";
        r += d.next->describe();
        break;
      }
      std::this_thread::sleep_for(milliseconds(2));
    }
    store.wait({flag + "admitted"});
    m->mark_done();
    return r;
  });
  for (int i = 0; i < 2; ++i) EXPECT_EQ(out[i], "epoch 1: islands 0, 1 | epoch 2: islands 0, 1, 2 (joining 2)") << i;
  EXPECT_NE(out[2].find("\"epoch\":2"), std::string::npos) << out[2];
  EXPECT_NE(out[2].find("\"joining\":[2]"), std::string::npos) << out[2];
  EXPECT_EQ(out[2].substr(out[2].find('|')), "|done");
}

// An admitted worker withdraws its join request: were it lost later and let go (SIGCONT) with
// its heartbeat back, a commit must not admit it again on the old request (the chaos test saw
// such admissions wait out the timeout for a worker that was leaving the run).
TEST_F(MembershipTest, AnAdmittedWorkerIsNotAdmittedAgainOnItsOldRequest) {
  const auto out = run_processes(3, [&](int island) {
    Store store(store_options("withdraw"));
    const std::string flag = store.run_prefix() + "/test/";
    auto m = std::make_unique<Membership>(store, options(island, 3));
    m->start_heartbeat();
    m->announce();
    View v = m->initial_view();
    if (island == 2) {
      m.reset();
      store.set(flag + "left", "1");
      Membership again(store, options(2, 3));
      again.start_heartbeat();
      again.request_join();
      const std::optional<View> admitted = again.wait_admission();
      again.withdraw_join();
      store.set(flag + "withdrawn", "1");
      store.wait({flag + "checked0", flag + "checked1"});
      return std::string(admitted ? "admitted" : "none");
    }
    store.wait({flag + "left"});
    v = m->reform(v, {});  // epoch 1: islands 0 and 1
    std::string r = "never admitted";
    for (int k = 1; k <= 2000; ++k) {
      const Decision d = m->decide(v, outer_attempt(k), true, true);
      if (d.next) {
        r = "admitted";
        break;
      }
      std::this_thread::sleep_for(milliseconds(2));
    }
    store.wait({flag + "withdrawn"});
    // Island 2 lives on (its heartbeat too) but asks nothing: a commit over epoch 1 admits no one.
    const Decision d = m->decide(v, outer_attempt(5000), true, true);
    r += d.commit && !d.next ? ", then no one" : ", then " + (d.next ? d.next->describe() : "an abort");
    store.set(flag + "checked" + std::to_string(island), "1");
    return r;
  });
  EXPECT_EQ(out, (std::vector<std::string>{"admitted, then no one", "admitted, then no one", "admitted"}));
}

TEST_F(MembershipTest, AWrongOrMissingRunTokenIsRefusedAndWritesNothing) {
  Store store(store_options("token"));
  publish_run_token(store, "right");
  EXPECT_NO_THROW(publish_run_token(store, "right"));  // the same token again: no change
  EXPECT_THROW(publish_run_token(store, "another"), ConfigError);
  // The store holds the token's verifier, never the token (the sealing keys come from it: seal.h).
  EXPECT_EQ(store.get(store.run_prefix() + "/members/run_token"), run_token_verifier("right"));
  const auto keys_now = [&] {
    Store s(store_options("token"));
    return s.get_many({s.run_prefix() + "/members/hb/0.0", s.run_prefix() + "/members/e0/ready/0.0",
                       s.run_prefix() + "/members/join/0.0", s.run_prefix() + "/members/run_token"});
  };
  for (const std::string& token : {std::string("wrong"), std::string()}) {
    MembershipOptions o = options(0, 2);
    o.run_token = token;
    Membership m(store, o);
    try {
      m.check_run_token();
      FAIL() << "token '" << token << "' was accepted";
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("worker 0.0: refused"), std::string::npos) << msg;
      EXPECT_NE(msg.find(token.empty() ? "none was given" : "is not the token of run 'token'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("fix: give the run's token with --token-file RUN_DIR/run.token"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("right"), std::string::npos) << "the message shows the run's token: " << msg;
    }
  }
  const auto after = keys_now();
  EXPECT_FALSE(after[0] || after[1] || after[2]) << "a refused worker wrote to the run";
  EXPECT_EQ(after[3].value_or(""), run_token_verifier("right"));
  MembershipOptions o = options(0, 2);
  o.run_token = "right";
  Membership m(store, o);
  EXPECT_NO_THROW(m.check_run_token());
}

// A run started by hand: the first worker's token stands, and a later one must bring the same.
TEST_F(MembershipTest, WithoutALauncherTheFirstTokenStands) {
  Store store(store_options("token-by-hand"));
  MembershipOptions o = options(0, 2);
  o.run_token = "first";
  Membership a(store, o);
  a.check_run_token();
  o.island = 1, o.run_token = "second";
  Membership b(store, o);
  EXPECT_THROW(b.check_run_token(), ConfigError);
}

// One process per place: a duplicate of a live worker is refused within about a heartbeat,
// naming the live one, whose heartbeat stays its own; once that one stops past the ttl (as a dead
// one would), a restarted worker takes the place, and the stopped one, let go, does not take it
// back.
TEST_F(MembershipTest, ALiveWorkersPlaceIsRefusedAndAStoppedOnesIsTakenWithinTheTtl) {
  const auto out = run_processes(2, [&](int p) {
    Store store(store_options("place"));
    const std::string flag = store.run_prefix() + "/test/", hb = store.run_prefix() + "/members/hb/1.0";
    if (p == 0) {  // the live island 1
      Membership live(store, options(1, 2));
      live.start_heartbeat();
      store.set(flag + "live", std::to_string(::getpid()));
      store.wait({flag + "refused"});
      ::raise(SIGSTOP);  // until the restarted one has the place
      const bool taken = eventually([&] { return live.place_taken(); });
      const std::string r = std::string(taken ? "taken" : "not told") + (store.get(hb) == live.token() ? ", took it back" : "");
      store.set(flag + "checked", "1");
      return r;
    }
    store.wait({flag + "live"});
    const pid_t live_pid = std::stoi(store.get(flag + "live").value());
    const std::string live_token = store.get(hb).value_or("");
    std::string r;
    const auto t0 = Clock::now();
    try {
      Membership duplicate(store, options(1, 2));
      duplicate.start_heartbeat();
      r = "accepted";
    } catch (const ConfigError& e) {
      r = e.what();
    }
    const double refused_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (store.get(hb) != live_token) r += " | the live heartbeat was replaced";
    store.set(flag + "refused", "1");
    if (!eventually([&] { return process_state(live_pid) == 'T'; })) return r + " | never stopped";
    const auto t1 = Clock::now();
    Membership restarted(store, options(1, 2));
    restarted.start_heartbeat();  // waits for the stopped one's heartbeat to lapse
    const double took_s = std::chrono::duration<double>(Clock::now() - t1).count();
    ::kill(live_pid, SIGCONT);
    store.wait({flag + "checked"});  // the let-go worker's heartbeat found the place taken and left it alone
    const std::string pid = "(pid " + std::to_string(live_pid) + ",";
    if (const size_t at = r.find(pid); at != std::string::npos) r.replace(at, pid.size(), "(pid LIVE,");
    return r + " | refused in " + (refused_s < 2 ? "time" : std::to_string(refused_s) + " s") + " | took it in " +
           (took_s < 2 ? "time" : std::to_string(took_s) + " s") + (store.get(hb) == restarted.token() ? "" : " | lost it");
  });
  char host[64] = {};
  ::gethostname(host, sizeof host - 1);
  EXPECT_NE(out[1].find("worker 1.0: refused: island 1 rank 0 is running (pid LIVE, host " + std::string(host) + ")"),
            std::string::npos) << out[1];
  EXPECT_NE(out[1].find("| refused in time | took it in time"), std::string::npos) << out[1];
  EXPECT_EQ(out[1].find("replaced"), std::string::npos) << out[1];
  EXPECT_EQ(out[1].find("lost it"), std::string::npos) << out[1];
  EXPECT_EQ(out[0], "taken");
}

// A wrong token is refused at once wherever that can be known: a run not on the store that is
// given another run's token (the run id is wrong: the error names the run), and a joiner of a run
// that is not on the store (within the ttl, not after the admission's timeout). A new run's first
// worker with a token that is no run's founds the run.
TEST_F(MembershipTest, AnotherRunsTokenAndAJoinerOfNoRunAreRefusedAtOnce) {
  Store launched(store_options("launched-run"));
  publish_run_token(launched, "launched-token");
  Store elsewhere(store_options("atoll-by-mistake"));
  const std::vector<std::string> run_keys = {elsewhere.run_prefix() + "/members/run_token",
                                             elsewhere.run_prefix() + "/members/hb/1.0"};
  MembershipOptions o = options(1, 2);
  o.run_token = "launched-token";
  Membership mistaken(elsewhere, o);
  const auto refusal = [](auto&& step) -> std::string {
    try {
      step();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "not refused";
  };
  const std::string other_token = refusal([&] { mistaken.check_run_token(); });
  EXPECT_NE(other_token.find("worker 1.0: refused: run 'atoll-by-mistake' is not on"), std::string::npos) << other_token;
  EXPECT_NE(other_token.find("the token given is run 'launched-run''s"), std::string::npos) << other_token;
  EXPECT_NE(other_token.find("fix: join that run with --run-dir RUN_DIR (its id is in RUN_DIR/run.id) or --run-id "
                             "launched-run"), std::string::npos) << other_token;
  const auto t0 = Clock::now();
  const std::string no_run = refusal([&] { mistaken.expect_run(); });
  EXPECT_NE(no_run.find("worker 1.0: refused: --join, but run 'atoll-by-mistake' is not on"), std::string::npos) << no_run;
  // The store is this suite's, shared by its tests: the list names the first five runs it holds.
  EXPECT_TRUE(no_run.find("launched-run") != std::string::npos || no_run.find(" more)") != std::string::npos)
      << "names the runs the store holds: " << no_run;
  EXPECT_NE(no_run.find("RUN_DIR/run.id"), std::string::npos) << no_run;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0) << "waited past the ttl (0.4 s)";
  for (const auto& v : elsewhere.get_many(run_keys)) EXPECT_FALSE(v) << "a refused worker wrote to the run";

  Store right(store_options("launched-run"));
  Membership joiner(right, o);
  EXPECT_NO_THROW(joiner.expect_run());
  EXPECT_NO_THROW(joiner.check_run_token());
  o.run_token = "a-new-runs-own-token";
  Membership founder(elsewhere, o);
  EXPECT_NO_THROW(founder.check_run_token());
  EXPECT_EQ(elsewhere.get(run_keys[0]), run_token_verifier("a-new-runs-own-token"));
}

}  // namespace
}  // namespace atl
