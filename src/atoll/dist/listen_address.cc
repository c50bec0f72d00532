#include "atoll/dist/listen_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>

#include "atoll/core/errors.h"
#include "atoll/dist/store.h"

namespace atl {

namespace {

struct Interface {
  std::string name, address;
};

std::vector<Interface> list_ipv4() {
  std::vector<Interface> out;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return out;
  for (const ifaddrs* a = all; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) out.push_back({a->ifa_name, text});
  }
  ::freeifaddrs(all);
  return out;
}

bool is_loopback(const std::string& ipv4) { return ipv4.rfind("127.", 0) == 0; }

std::string interfaces_text() {
  std::string s;
  for (const std::string& i : ipv4_interfaces()) s += (s.empty() ? "" : ", ") + i;
  return s.empty() ? "none with an IPv4 address" : s;
}

// The store's IPv4 address (ConfigError when its host does not resolve).
sockaddr_in store_address(const std::string& store_url, const StoreAddress& store) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(store.host.c_str(), std::to_string(store.port).c_str(), &hints, &found) != 0 || !found)
    throw ConfigError("cannot resolve the store host '" + store.host + "' (" + store_url +
                      "); fix: give --store an address this machine can reach");
  const sockaddr_in a = *reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  return a;
}

std::string text_of(const in_addr& a) {
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, text, sizeof text);
  return text;
}

}  // namespace

std::vector<std::string> ipv4_interfaces() {
  std::vector<std::string> out;
  for (const Interface& i : list_ipv4()) out.push_back(i.name + " " + i.address);
  return out;
}

ListenAddress choose_listen_address(const std::string& store_url, const std::string& iface, const std::string& iface_from) {
  const StoreAddress store = parse_store_url(store_url);
  const sockaddr_in target = store_address(store_url, store);
  const std::string store_ip = text_of(target.sin_addr);
  const bool store_here = is_loopback(store_ip);
  if (!iface.empty()) {
    if (::if_nametoindex(iface.c_str()) == 0)
      throw ConfigError(iface_from + " " + iface + ": this host has no such network interface (its interfaces: " +
                        interfaces_text() + "); fix: name one of them, or leave " + iface_from +
                        " out to use the one that routes to the store");
    std::optional<Interface> found;
    for (const Interface& i : list_ipv4())
      if (i.name == iface && !found) found = i;
    if (!found)
      throw ConfigError(iface_from + " " + iface + " has no IPv4 address, or is down (interfaces with one: " +
                        interfaces_text() + "); fix: name one of them, or give " + iface + " an address");
    if (is_loopback(found->address) && !store_here)
      throw ConfigError(iface_from + " " + iface + " is the loopback interface (" + found->address +
                        "), but the store " + store.host + " (" + store_ip + ") is on another host: the other workers "
                        "could not reach this one; fix: name the interface that reaches the other hosts (" +
                        interfaces_text() + "), or leave " + iface_from + " out to use the one that routes to the store");
    return {.address = found->address, .iface = iface, .why = iface_from};
  }
  if (store_here) return {.address = "127.0.0.1", .iface = "lo", .why = "the store is on this host"};
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  const bool routed = fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&target), sizeof target) == 0 &&
                      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  if (fd >= 0) ::close(fd);
  if (!routed)
    throw ConfigError("no route from this host to the store " + store.host + " (" + store_ip + "); its interfaces: " +
                      interfaces_text() + "; fix: connect this host to the store's network, or name the interface "
                      "that reaches it with --iface");
  ListenAddress out{.address = text_of(local.sin_addr), .iface = "", .why = "the route to the store"};
  if (is_loopback(out.address))  // a store address this host holds itself, reached over lo
    out.why = "the store is on this host";
  for (const Interface& i : list_ipv4())
    if (i.address == out.address && out.iface.empty()) out.iface = i.name;
  return out;
}

}  // namespace atl
