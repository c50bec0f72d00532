// The private redis-server: starts on a free loopback port and answers PING, stops for good,
// says what to install when the binary is missing, and says so when a fixed port is taken; with a
// password it refuses clients without it (a clear error at once), and the password is not on
// its command line.
#include "atoll/supervise/redis_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>

#include "atoll/core/errors.h"
#include "atoll/dist/store.h"

namespace atl {
namespace {

using std::chrono::milliseconds;

TEST(RedisServer, StartsOnLoopbackAnswersPingAndStops) {
  RedisServer server;
  EXPECT_GT(server.port(), 0);
  EXPECT_EQ(server.url(), "redis://127.0.0.1:" + std::to_string(server.port()));
  EXPECT_TRUE(redis_ping("127.0.0.1", server.port(), milliseconds(1000)));
  const int port = server.port();
  server.stop();
  std::string why;
  EXPECT_FALSE(redis_ping("127.0.0.1", port, milliseconds(200), &why));
  EXPECT_FALSE(why.empty());
  server.stop();  // idempotent
}

TEST(RedisServer, APasswordIsRequiredAndNotOnTheCommandLine) {
  RedisServer server(RedisServerOptions{.password = "pw0123456789"});
  EXPECT_TRUE(redis_ping("127.0.0.1", server.port(), milliseconds(1000), nullptr, "pw0123456789"));
  EXPECT_THROW(redis_ping("127.0.0.1", server.port(), milliseconds(1000)), ConfigError);  // none given
  std::ifstream f("/proc/" + std::to_string(server.pid()) + "/cmdline");
  std::string cmdline((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(cmdline.empty());
  EXPECT_EQ(cmdline.find("pw0123456789"), std::string::npos) << "ps shows the password";
  // A client with a wrong password: a clear error at once, not a wait for the store's timeout.
  const auto t0 = std::chrono::steady_clock::now();
  try {
    Store store(StoreOptions{.url = "redis://:wrong@127.0.0.1:" + std::to_string(server.port()),
                             .timeout = milliseconds(20000)});
    FAIL() << "a wrong password was accepted";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("store refused the password"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fix: give the store's password as redis://:PASSWORD@HOST:PORT"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("wrong"), std::string::npos) << "the message shows the password: " << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(5000));
  Store store(StoreOptions{.url = "redis://:pw0123456789@127.0.0.1:" + std::to_string(server.port())});
  store.set("k", "v");
  EXPECT_EQ(store.get("k").value_or(""), "v");
}

TEST(RedisServer, TwoServersGetTwoPorts) {
  RedisServer a, b;
  EXPECT_NE(a.port(), b.port());
  EXPECT_TRUE(redis_ping("127.0.0.1", a.port(), milliseconds(1000)));
  EXPECT_TRUE(redis_ping("127.0.0.1", b.port(), milliseconds(1000)));
}

TEST(RedisServer, MissingBinaryIsAClearError) {
  try {
    RedisServer server(RedisServerOptions{.binary = "atoll-no-such-redis-server"});
    FAIL() << "started a server that does not exist";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("atoll-no-such-redis-server"), std::string::npos) << msg;
    EXPECT_NE(msg.find("apt-get install redis-server"), std::string::npos) << msg;
  }
}

TEST(RedisServer, FixedPortInUseIsAClearErrorNotAHang) {
  // Hold a listening socket on a port, then ask for exactly that port.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    RedisServer server(RedisServerOptions{.port = port, .start_timeout = milliseconds(5000)});
    FAIL() << "redis-server started on a port that is taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ::close(fd);
}

}  // namespace
}  // namespace atl
