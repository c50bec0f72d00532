// The address a worker listens on (dist/listen_address.h): the named interface's, loopback for a
// store on this host, the routed one for a store elsewhere; a missing interface, a loopback
// interface for a remote store and an unresolvable store are ConfigErrors naming them and the fix.
#include "atoll/dist/listen_address.h"

#include <gtest/gtest.h>

#include <string>

#include "atoll/core/errors.h"

namespace atl {
namespace {

// An address outside this host (TEST-NET-2, RFC 5737: never assigned, never answered; a UDP
// connect towards it sends nothing).
constexpr const char* kRemoteStore = "redis://198.51.100.7:6379";

std::string error_of(const std::string& store, const std::string& iface, const std::string& from = "--iface") {
  try {
    choose_listen_address(store, iface, from);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ListenAddress, AStoreOnThisHostMeansLoopback) {
  const ListenAddress a = choose_listen_address("redis://127.0.0.1:6379");
  EXPECT_EQ(a.address, "127.0.0.1");
  EXPECT_EQ(a.why, "the store is on this host");
  EXPECT_EQ(choose_listen_address("redis://localhost:1", "lo").address, "127.0.0.1");
}

TEST(ListenAddress, ARemoteStoreGivesTheRoutedAddressOrSaysThereIsNoRoute) {
  try {
    const ListenAddress a = choose_listen_address(kRemoteStore);
    EXPECT_NE(a.address.rfind("127.", 0), 0u) << a.address;
    EXPECT_FALSE(a.iface.empty()) << "the routed address belongs to no interface: " << a.address;
    EXPECT_EQ(a.why, "the route to the store");
    // Naming that interface gives the same address.
    EXPECT_EQ(choose_listen_address(kRemoteStore, a.iface).address, a.address);
  } catch (const ConfigError& e) {  // a host without a default route
    EXPECT_NE(std::string(e.what()).find("no route from this host to the store 198.51.100.7"), std::string::npos)
        << e.what();
  }
}

TEST(ListenAddress, MistakesAreConfigErrorsNamingTheInterfaceAndTheFix) {
  std::string e = error_of(kRemoteStore, "nosuch0");
  EXPECT_NE(e.find("--iface nosuch0: this host has no such network interface (its interfaces: "), std::string::npos) << e;
  EXPECT_NE(e.find("lo 127.0.0.1"), std::string::npos) << e;  // the list names what there is
  EXPECT_NE(e.find("fix"), std::string::npos) << e;
  e = error_of(kRemoteStore, "lo", "GLOO_SOCKET_IFNAME");
  EXPECT_NE(e.find("GLOO_SOCKET_IFNAME lo is the loopback interface (127.0.0.1), but the store 198.51.100.7"),
            std::string::npos) << e;
  EXPECT_NE(e.find("could not reach this one; fix"), std::string::npos) << e;
  e = error_of("redis://no-such-host.invalid:6379", "");
  EXPECT_NE(e.find("cannot resolve the store host 'no-such-host.invalid'"), std::string::npos) << e;
}

}  // namespace
}  // namespace atl
