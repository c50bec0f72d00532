#include "atoll/supervise/doctor_peers.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "atoll/supervise/run_secrets.h"

namespace atl {

namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

constexpr Ms kPeerTtl{10000};  // a dead doctor's key is gone this long after its last renewal
constexpr Ms kRenew{1000};
constexpr Ms kPoll{50};        // how often the waits look at the store again
constexpr Ms kHelloTimeout{2000};

struct Peer {
  std::string who, host, address;
  int port = 0;
  std::string text() const {
    return (who.empty() ? "" : who + " on ") + host + " (" + address + ":" + std::to_string(port) + ")";
  }
};

std::string hostname() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "?";
}

void set_timeouts(int fd, Ms t) {
  const timeval tv{static_cast<time_t>(t.count() / 1000), static_cast<suseconds_t>(t.count() % 1000 * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// One line from `fd`, up to 256 bytes (the sockets' timeouts bound the wait); "" on failure.
std::string read_line(int fd) {
  std::string line;
  char c = 0;
  while (line.size() < 256 && ::read(fd, &c, 1) == 1) {
    if (c == '\n') return line;
    line += c;
  }
  return "";
}

bool write_all(int fd, const std::string& s) {
  for (size_t done = 0; done < s.size();) {
    const ssize_t n = ::send(fd, s.data() + done, s.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

// Answers the other doctors on the listening socket until destroyed: "ok" to the hello that
// names this doctor (so a reply proves the connection reached it, not another program that
// took a published port), "wrong" to any other.
class Answerer {
 public:
  Answerer(int fd, std::string hello) : fd_(fd), hello_(std::move(hello)), thread_([this] { run(); }) {}
  ~Answerer() {
    stop_ = true;
    thread_.join();
  }

 private:
  void run() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      set_timeouts(c, kHelloTimeout);
      write_all(c, read_line(c) == hello_ ? "ok\n" : "wrong\n");
      ::close(c);
    }
  }
  int fd_;
  std::string hello_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string hello_for(const std::string& run_id, const std::string& nonce) { return "atoll-doctor " + run_id + " " + nonce; }

// Connects to `p` and exchanges the hello: "" when it answered as itself (the connect's time in
// *ms), else why not.
std::string try_peer(const Peer& p, const std::string& hello, Ms timeout, double* ms) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(p.port));
  if (::inet_pton(AF_INET, p.address.c_str(), &a.sin_addr) != 1) return "'" + p.address + "' is not an IPv4 address";
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return std::string("socket: ") + std::strerror(errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const auto t0 = Clock::now();
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS)
    return std::strerror(errno);
  pollfd pf{fd, POLLOUT, 0};
  const int n = ::poll(&pf, 1, int(timeout.count()));
  if (n == 0) {
    char s[32];
    std::snprintf(s, sizeof s, "%.3g", double(timeout.count()) / 1000);
    return std::string("no answer to the connect within ") + s + " s (a firewall dropping the packets, or no route)";
  }
  int err = 0;
  socklen_t len = sizeof err;
  if (n < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) return std::strerror(err);
  *ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  set_timeouts(fd, kHelloTimeout);
  if (!write_all(fd, hello + "\n")) return "the connection closed before the hello";
  if (read_line(fd) != "ok") return "something answered, but not that doctor (another program on its port?)";
  return "";
}

// The other doctors' records, by nonce (malformed ones are skipped: not a doctor's).
std::map<std::string, Peer> read_peers(Store& store, const std::string& prefix, const std::string& me) {
  std::map<std::string, Peer> out;
  const std::vector<std::string> keys = store.scan(prefix + "peer/*");
  const auto values = store.get_many(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string nonce = keys[i].substr(keys[i].rfind('/') + 1);
    if (nonce == me || !values[i]) continue;
    const nlohmann::json j = nlohmann::json::parse(*values[i], nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("address") || !j["address"].is_string() || !j.contains("port") ||
        !j["port"].is_number_integer())
      continue;
    out[nonce] = Peer{.who = j.value("who", ""), .host = j.value("host", "?"), .address = j["address"],
                      .port = j["port"].get<int>()};
  }
  return out;
}

}  // namespace

PeerMeeting meet_peers(Store& store, const PeerMeetingOptions& o) {
  const std::string nonce = random_secret().substr(0, 16);
  const std::string prefix = "atoll-doctor/" + o.run_id + "/";
  const std::string my_key = prefix + "peer/" + nonce;
  const std::string me =
      nlohmann::json{{"who", o.who}, {"host", hostname()}, {"address", o.address}, {"port", o.port}}.dump();
  const Answerer answerer(o.listen_fd, hello_for(o.run_id, nonce));
  std::optional<Clock::time_point> last_renewal;
  auto renew = [&] {
    if (last_renewal && Clock::now() - *last_renewal < kRenew) return;
    store.set_with_ttl(my_key, me, kPeerTtl);
    last_renewal = Clock::now();
  };

  PeerMeeting out;
  std::map<std::string, Peer> peers;
  const auto meet_by = Clock::now() + o.wait;
  for (;;) {
    renew();
    peers = read_peers(store, prefix, nonce);
    if (int(peers.size()) + 1 >= o.peers || Clock::now() >= meet_by) break;
    std::this_thread::sleep_for(kPoll);
  }
  out.met = int(peers.size()) + 1;

  nlohmann::json failed = nlohmann::json::array();
  for (const auto& [other, p] : peers) {
    renew();
    double ms = 0;
    const std::string why = try_peer(p, hello_for(o.run_id, other), o.connect_timeout, &ms);
    char took[32];
    std::snprintf(took, sizeof took, "%.1f ms", ms);
    if (why.empty()) {
      out.reached.push_back(p.text() + " in " + took);
    } else {
      out.unreached.push_back(p.text() + ": " + why);
      failed.push_back(other);
    }
  }
  store.set_with_ttl(prefix + "done/" + nonce, failed.dump(), o.wait + kPeerTtl);

  // The others' reports, while this one still answers their connections.
  std::set<std::string> waiting;
  for (const auto& [other, p] : peers) waiting.insert(other);
  const auto reports_by = Clock::now() + o.wait;
  while (!waiting.empty()) {
    renew();
    for (auto it = waiting.begin(); it != waiting.end();) {
      const std::optional<std::string> done = store.get(prefix + "done/" + *it);
      if (!done) {
        ++it;
        continue;
      }
      const nlohmann::json j = nlohmann::json::parse(*done, nullptr, false);
      if (j.is_array())
        for (const auto& n : j)
          if (n.is_string() && n.get<std::string>() == nonce) out.unreached_by.push_back(peers[*it].text());
      it = waiting.erase(it);
    }
    if (waiting.empty() || Clock::now() >= reports_by) break;
    std::this_thread::sleep_for(kPoll);
  }
  for (const std::string& other : waiting) out.silent.push_back(peers[other].text());
  store.erase_if_equal(my_key, me);
  return out;
}

}  // namespace atl
