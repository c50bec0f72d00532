// The rendezvous store: URL parsing, key operations, Gloo prefix views, bounded waits, an
// unreachable store failing with Timeout within its timeout, and a server that restarts (kill -9
// of a real redis-server): reconnecting, kept keys written back, a wrong password still refused;
// claims (a write that never replaces another's value), expiries read with the value, SCAN.
#include "atoll/dist/store.h"

#include <gloo/rendezvous/store.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "atoll/core/errors.h"
#include "atoll/supervise/redis_server.h"

namespace atl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

class StoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new RedisServer(); }
  static void TearDownTestSuite() { delete server_; }
  static RedisServer* server_;
};
RedisServer* StoreTest::server_ = nullptr;

TEST(StoreUrl, Parses) {
  EXPECT_EQ(parse_store_url("redis://10.0.0.2:7000").host, "10.0.0.2");
  EXPECT_EQ(parse_store_url("redis://10.0.0.2:7000").port, 7000);
  EXPECT_EQ(parse_store_url("localhost").port, 6379);
  EXPECT_EQ(parse_store_url("h:1").url(), "redis://h:1");
  for (const char* bad :
       {"", "http://h:1", "redis://h:port", "redis://h:0", "redis://h:70000", "redis://:5", "redis://h:1/x"})
    EXPECT_THROW(parse_store_url(bad), ConfigError) << bad;
}

TEST(StoreUrl, AnIpv6HostIsWrittenInBracketsAndAMalformedOneIsNamed) {
  EXPECT_EQ(parse_store_url("redis://[::1]:7000").host, "::1");
  EXPECT_EQ(parse_store_url("redis://[::1]:7000").port, 7000);
  EXPECT_EQ(parse_store_url("redis://[fe80::2]").port, 6379);
  EXPECT_EQ(parse_store_url("redis://[::1]:7000").url(), "redis://[::1]:7000");
  const auto error = [](const std::string& url) {
    try {
      parse_store_url(url);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error("redis://[::1").find("is not closed"), std::string::npos) << error("redis://[::1");
  EXPECT_NE(error("redis://[::1]x").find("is not ':PORT'"), std::string::npos);
  EXPECT_NE(error("redis://::1:6379").find("needs brackets"), std::string::npos);
  EXPECT_NE(error("redis://[]:6379").find("has no host"), std::string::npos);
}

TEST(StoreUrl, TakesAPasswordAndNeverShowsIt) {
  const StoreAddress a = parse_store_url("redis://:s3cr@t@10.0.0.2:7000");
  EXPECT_EQ(a.password, "s3cr@t");
  EXPECT_EQ(a.host, "10.0.0.2");
  EXPECT_EQ(a.port, 7000);
  EXPECT_EQ(a.url(), "redis://10.0.0.2:7000");
  EXPECT_EQ(parse_store_url("redis://default:pw@h:1").password, "pw");
  EXPECT_EQ(redact_store_url("redis://:pw@h:1"), "redis://:***@h:1");
  for (const char* bad : {"redis://user:pw@h:1", "redis://:@h:1", "redis://pw@h:1", "redis://:pw@h:port"}) {
    try {
      parse_store_url(bad);
      FAIL() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).find("pw@"), std::string::npos) << "the message shows the password: " << e.what();
    }
  }
}

TEST_F(StoreTest, KeyOperations) {
  Store store(StoreOptions{.url = server_->url(), .run_id = "keys"});
  EXPECT_EQ(store.run_prefix(), "atoll/keys");
  EXPECT_EQ(store.group_prefix("island0", 3), "atoll/keys/island0/e3");
  EXPECT_FALSE(store.get("atoll/keys/a").has_value());
  EXPECT_TRUE(store.set_if_absent("atoll/keys/a", "1"));
  EXPECT_FALSE(store.set_if_absent("atoll/keys/a", "2"));
  EXPECT_EQ(store.get("atoll/keys/a").value(), "1");
  store.set("atoll/keys/a", std::string("x\0y", 3));  // binary-safe
  EXPECT_EQ(store.get("atoll/keys/a").value(), std::string("x\0y", 3));
  EXPECT_EQ(store.increment("atoll/keys/epoch"), 1);
  EXPECT_EQ(store.increment("atoll/keys/epoch", 5), 6);
  EXPECT_EQ(store.exists({"atoll/keys/a", "atoll/keys/none"}), (std::vector<bool>{true, false}));
}

// The commands membership needs: keys with an expiry (heartbeats), several keys in one round
// trip, deletion (also only of one's own value).
TEST_F(StoreTest, ExpiringKeysManyKeysAtOnceAndDeletion) {
  Store store(StoreOptions{.url = server_->url(), .run_id = "ttl"});
  store.set_with_ttl("atoll/ttl/hb", "token-1", std::chrono::milliseconds(60000));
  store.set("atoll/ttl/plain", "p");
  EXPECT_EQ(store.get_many({"atoll/ttl/hb", "atoll/ttl/none", "atoll/ttl/plain"}),
            (std::vector<std::optional<std::string>>{"token-1", std::nullopt, "p"}));
  EXPECT_TRUE(store.get_many({}).empty());
  EXPECT_FALSE(store.erase_if_equal("atoll/ttl/hb", "token-0"));  // another writer's value stays
  EXPECT_EQ(store.get("atoll/ttl/hb").value(), "token-1");
  EXPECT_TRUE(store.erase_if_equal("atoll/ttl/hb", "token-1"));
  store.set("atoll/ttl/hb", "again");
  store.erase("atoll/ttl/hb");
  store.erase("atoll/ttl/never-there");
  EXPECT_FALSE(store.get("atoll/ttl/hb").has_value());
  // An expiring key lives until its ttl passes without a refresh (Redis expires it, not us).
  store.set_with_ttl("atoll/ttl/short", "x", std::chrono::milliseconds(30));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (store.get("atoll/ttl/short") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(store.get("atoll/ttl/short").has_value());
  EXPECT_EQ(store.get("atoll/ttl/plain").value(), "p");  // keys without a ttl stay
}

// A heartbeat's claim: written while absent or one's own, never over another's; the expiry read
// with the value moves with every write (how a reader tells a live writer); SCAN finds keys by glob.
TEST_F(StoreTest, ClaimsExpiriesAndScan) {
  Store store(StoreOptions{.url = server_->url(), .run_id = "claim"});
  const std::string k = "atoll/claim/hb";
  EXPECT_FALSE(store.get_expiring(k).has_value());
  EXPECT_TRUE(store.set_with_ttl_if_free(k, "mine", milliseconds(60000)));
  const Store::Expiring first = store.get_expiring(k).value();
  EXPECT_EQ(first.value, "mine");
  EXPECT_GT(first.expires_at_ms, 0);
  EXPECT_FALSE(store.set_with_ttl_if_free(k, "theirs", milliseconds(60000)));
  EXPECT_EQ(store.get(k).value(), "mine");
  EXPECT_EQ(store.get_expiring(k)->expires_at_ms, first.expires_at_ms) << "a refused claim moved the expiry";
  EXPECT_TRUE(store.set_with_ttl_if_free(k, "mine", milliseconds(120000)));  // a refresh of one's own
  EXPECT_GT(store.get_expiring(k)->expires_at_ms, first.expires_at_ms);
  store.set("atoll/claim/plain", "p");
  EXPECT_EQ(store.get_expiring("atoll/claim/plain")->expires_at_ms, -1) << "no expiry";
  EXPECT_EQ(store.scan("atoll/claim/*"), (std::vector<std::string>{"atoll/claim/hb", "atoll/claim/plain"}));
  EXPECT_TRUE(store.scan("atoll/nothing-here/*").empty());
}

TEST_F(StoreTest, GlooViewPrefixesKeysAndWritesOnce) {
  Store store(StoreOptions{.url = server_->url(), .run_id = "view"});
  auto view = store.gloo_view(store.group_prefix("g", 0));
  view->set("0", {'a', 'b'});
  EXPECT_EQ(store.get("atoll/view/g/e0/0").value(), "ab");
  EXPECT_EQ(view->get("0"), (std::vector<char>{'a', 'b'}));
  EXPECT_THROW(view->set("0", {'c'}), ConfigError);  // a second writer of the same key
}

TEST_F(StoreTest, WaitIsBoundedAndNamesTheMissingKey) {
  Store store(StoreOptions{.url = server_->url(), .run_id = "wait", .timeout = milliseconds(300)});
  store.set("atoll/wait/here", "1");
  const auto t0 = Clock::now();
  try {
    store.wait({"atoll/wait/here", "atoll/wait/never"});
    FAIL() << "waited for a key nobody sets";
  } catch (const Timeout& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("atoll/wait/never"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("atoll/wait/here"), std::string::npos) << msg;
  }
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, milliseconds(300));
  EXPECT_LT(took, milliseconds(1500));
  // Gloo's get() waits too, bounded by the same timeout.
  auto view = store.gloo_view("atoll/wait");
  EXPECT_THROW(view->get("never"), Timeout);
}

TEST_F(StoreTest, WaitReturnsWhenAnotherClientSetsTheKey) {
  Store store(StoreOptions{.url = server_->url(), .run_id = "wait2", .timeout = milliseconds(10000)});
  std::thread writer([&] {
    Store other(StoreOptions{.url = server_->url(), .run_id = "wait2"});
    other.set("atoll/wait2/late", "1");
  });
  store.wait({"atoll/wait2/late"});
  writer.join();
  EXPECT_EQ(store.get("atoll/wait2/late").value(), "1");
}

TEST(StoreUnreachable, TimesOutWithinTheTimeoutAndNamesTheAddress) {
  // A port that nothing listens on: start a server, note its port, stop it.
  int port;
  {
    RedisServer gone;
    port = gone.port();
  }
  const std::string url = "redis://127.0.0.1:" + std::to_string(port);
  const auto t0 = Clock::now();
  try {
    Store store(StoreOptions{.url = url, .timeout = milliseconds(500)});
    FAIL() << "connected to a store that is not there";
  } catch (const Timeout& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(url + ": store unreachable after 0.5 s"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fix: start redis-server or pass --store"), std::string::npos) << msg;
  }
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, milliseconds(500));
  EXPECT_LT(took, milliseconds(2000));
}

// kill -9 of the server, then RedisServer::restart_if_ended until it has started it again.
std::string kill_and_restart(RedisServer& server) {
  EXPECT_EQ(server.restart_if_ended(), "") << "running";
  if (server.pid() <= 0) return "not running";  // never kill(-1): that signals every process
  EXPECT_EQ(::kill(server.pid(), SIGKILL), 0);
  for (int i = 0; i < 1000; ++i) {
    if (std::string how = server.restart_if_ended(); !how.empty()) return how;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return "never ended";
}

TEST(StoreRestart, CommandsReconnectAndKeptKeysAreWrittenBack) {
  RedisServer server(RedisServerOptions{.password = "pw-restart"});
  const int port = server.port();
  Store store(StoreOptions{.url = server.url(), .password = "pw-restart", .run_id = "r", .timeout = milliseconds(10000)});
  Store beats(store.options());
  store.share_kept_keys_with(beats);
  store.set("atoll/r/plain", "1");
  store.set("atoll/r/kept", "v1");
  store.keep("slot", "atoll/r/kept", "v1");
  store.keep("slot", "atoll/r/kept", "v2");  // the newer value of the slot replaces the older
  auto view = store.gloo_view("atoll/r/g");
  view->set("0", {'a'});  // a rendezvous key is kept too: peers may wait for it
  EXPECT_EQ(store.reconnections(), 0u);

  EXPECT_EQ(kill_and_restart(server), "signal 9");
  EXPECT_EQ(server.port(), port);
  // The other connection notices first and writes the shared kept keys back.
  EXPECT_EQ(beats.get("atoll/r/kept").value(), "v2");
  EXPECT_EQ(beats.reconnections(), 1u);
  EXPECT_FALSE(store.get("atoll/r/plain").has_value()) << "a restarted store is empty";
  EXPECT_EQ(store.reconnections(), 1u);
  EXPECT_EQ(store.get("atoll/r/g/0").value(), "a");
  view->set("0", {'a'});  // our own key, written again: not another writer
  EXPECT_THROW(view->set("0", {'b'}), ConfigError);
  store.set("atoll/r/plain", "2");
  EXPECT_EQ(store.get("atoll/r/plain").value(), "2");
}

TEST(StoreRestart, AStoreThatStaysAwayFailsWithinTheTimeout) {
  auto server = std::make_unique<RedisServer>();
  Store store(StoreOptions{.url = server->url(), .run_id = "away", .timeout = milliseconds(500)});
  store.set("atoll/away/a", "1");
  server.reset();
  const auto t0 = Clock::now();
  try {
    store.get("atoll/away/a");
    FAIL() << "read from a store that is gone";
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("connection lost"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not back within 0.5 s"), std::string::npos) << msg;
  }
  EXPECT_LT(Clock::now() - t0, milliseconds(3000));
}

// A cut link that comes back (here: the server stopped, SIGSTOP, then let go): a command with no
// answer is a Timeout, and the next command reconnects and reads its own answer. Before, the
// connection kept hiredis's error and every later command failed, or read the late answer of
// the one that timed out.
TEST(StoreRestart, ACommandThatTimedOutLeavesTheNextOneItsOwnAnswer) {
  RedisServer server;
  Store store(StoreOptions{.url = server.url(), .run_id = "cut", .timeout = milliseconds(300)});
  store.set("atoll/cut/a", "A");
  store.set("atoll/cut/b", "B");
  ASSERT_GT(server.pid(), 0);
  ASSERT_EQ(::kill(server.pid(), SIGSTOP), 0);
  EXPECT_THROW(store.get("atoll/cut/a"), Timeout);
  ASSERT_EQ(::kill(server.pid(), SIGCONT), 0);
  EXPECT_EQ(store.get("atoll/cut/b").value(), "B") << "the answer of another command";
  EXPECT_EQ(store.get("atoll/cut/a").value(), "A");
  EXPECT_EQ(store.reconnections(), 1u);
}

TEST(StoreRestart, AServerBackWithAnotherPasswordIsRefusedAtOnce) {
  auto server = std::make_unique<RedisServer>(RedisServerOptions{.password = "first"});
  const int port = server->port();
  Store store(StoreOptions{.url = server->url(), .password = "first", .run_id = "pw", .timeout = milliseconds(30000)});
  server.reset();
  server = std::make_unique<RedisServer>(RedisServerOptions{.port = port, .password = "second"});
  const auto t0 = Clock::now();
  try {
    store.get("atoll/pw/a");
    FAIL() << "a refused password was retried or accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("store refused the password"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, milliseconds(10000)) << "not waited out to the timeout";
}

}  // namespace
}  // namespace atl
