// The address a worker listens on for its peers (Gloo's TCP pairs), chosen so that the others
// can reach it (docs/cluster.md "Interfaces"):
//   - an interface named by the user (`--iface NAME`, or Gloo's GLOO_SOCKET_IFNAME, one name):
//     its IPv4 address;
//   - else, with the store on this host (a loopback address): 127.0.0.1, a one-machine run;
//   - else the local address the kernel routes towards the store's host (a UDP connect sends
//     nothing, it only picks the route), on whatever interface that is: the other hosts reach
//     the store, so they reach this address the same way.
// Refused with a ConfigError naming the interface and the fix: an interface this host does not
// have (the error lists those it has), one without an IPv4 address, a loopback address while the
// store is on another host (the other workers would dial their own loopback), a store host that
// does not resolve or that no route leads to.
#pragma once

#include <string>
#include <vector>

namespace atl {

struct ListenAddress {
  std::string address;  // IPv4, dotted
  std::string iface;    // the interface holding it ("" when no interface holds it)
  std::string why;      // "--iface", "GLOO_SOCKET_IFNAME", "the route to the store", "the store is on this host"
};

// `iface` "" = choose by the store; `iface_from` names where `iface` came from, for messages.
ListenAddress choose_listen_address(const std::string& store_url, const std::string& iface = "",
                                    const std::string& iface_from = "--iface");

// This host's interfaces with an IPv4 address, "name address" each, for messages.
std::vector<std::string> ipv4_interfaces();

}  // namespace atl
