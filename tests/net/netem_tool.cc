// atoll_netem: the WAN links of emulated hosts (tests/net/emulated_hosts.sh), for a kernel
// without netem. Three subcommands, each bounded in time:
//
//   atoll_netem forward --prefix 10.79 --link I:DELAY_MS[:JITTER_MS[:LOSS]]... [--seed S] [--max-s T]
//       In the router namespace: reads IPv4 packets from a TUN device (atltun, IFF_TUN|IFF_NO_PI)
//       into which policy routing sends every packet the hosts send through the router, holds
//       each for its links' delay and writes it back, whence the kernel routes it on to its
//       host. Host I sits at PREFIX.I.2 (link I); a packet from host a to host b waits
//       delay(a) + delay(b) plus a uniform jitter in ±(jitter(a) + jitter(b)), never overtaking an
//       earlier packet of the same pair (TCP takes reordering for loss), and is dropped with
//       probability 1 - (1 - loss(a))(1 - loss(b)). So a ping from a to b takes
//       2·(delay(a) + delay(b)). Exits after --max-s seconds (default 900) or on SIGTERM.
//   atoll_netem echo --port P [--max-s T]
//       A UDP echo server on 0.0.0.0:P.
//   atoll_netem probe --to HOST --port P --count N [--interval-ms M] [--wait-ms W]
//       Sends N numbered UDP datagrams to an echo server, one every M ms (default 2), waits W ms
//       (default 2000) after the last for the echoes, and prints one JSON line:
//       {"sent": N, "received": K, "rtt_ms_median": X, "rtt_ms_min": Y}.
//
// Rate limits are the kernel's `tc ... tbf`, which this kernel has.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <queue>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "atoll_netem: %s\n", why.c_str());
  std::exit(2);
}

// --name value pairs and repeated --link values.
struct Args {
  std::map<std::string, std::string> one;
  std::vector<std::string> links;
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = one.find(k);
    return it == one.end() ? def : it->second;
  }
};

Args parse(int argc, char** argv, int from) {
  Args a;
  for (int i = from; i < argc; i += 2) {
    if (i + 1 >= argc || std::strncmp(argv[i], "--", 2) != 0) die(std::string("bad argument ") + argv[i]);
    if (std::strcmp(argv[i], "--link") == 0) a.links.push_back(argv[i + 1]);
    else a.one[argv[i] + 2] = argv[i + 1];
  }
  return a;
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

struct Link {
  double delay_ms = 0, jitter_ms = 0, loss = 0;
};

struct Held {
  Clock::time_point due;
  uint64_t seq;
  std::vector<uint8_t> bytes;
  bool operator>(const Held& o) const { return due != o.due ? due > o.due : seq > o.seq; }
};

int forward(const Args& a) {
  const std::string prefix = a.get("prefix", "10.79");
  in_addr base{};
  if (::inet_pton(AF_INET, (prefix + ".0.0").c_str(), &base) != 1) die("bad --prefix " + prefix);
  const uint32_t base16 = ntohl(base.s_addr) >> 16;
  std::map<int, Link> links;
  for (const std::string& l : a.links) {
    Link k;
    int host = -1;
    if (std::sscanf(l.c_str(), "%d:%lf:%lf:%lf", &host, &k.delay_ms, &k.jitter_ms, &k.loss) < 2 || host < 0 ||
        host > 255 || k.delay_ms < 0 || k.jitter_ms < 0 || k.loss < 0 || k.loss > 1)
      die("bad --link " + l + " (I:DELAY_MS[:JITTER_MS[:LOSS]])");
    links[host] = k;
  }
  const double max_s = std::atof(a.get("max-s", "900").c_str());
  std::mt19937_64 rng(std::strtoull(a.get("seed", "1").c_str(), nullptr, 10));
  std::uniform_real_distribution<double> unit(0.0, 1.0);

  const int tun = ::open("/dev/net/tun", O_RDWR | O_CLOEXEC);
  if (tun < 0) die(std::string("open /dev/net/tun: ") + std::strerror(errno));
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::snprintf(ifr.ifr_name, IFNAMSIZ, "%s", a.get("tun", "atltun").c_str());
  if (::ioctl(tun, TUNSETIFF, &ifr) < 0) die(std::string("TUNSETIFF: ") + std::strerror(errno));
  ::fcntl(tun, F_SETFL, O_NONBLOCK);
  std::printf("ready\n");
  std::fflush(stdout);

  auto link_of = [&](uint32_t addr) -> const Link* {
    if ((addr >> 16) != base16) return nullptr;
    auto it = links.find(int((addr >> 8) & 0xff));
    return it == links.end() ? nullptr : &it->second;
  };
  std::priority_queue<Held, std::vector<Held>, std::greater<>> queue;
  std::map<std::pair<uint32_t, uint32_t>, Clock::time_point> last_due;  // per (src, dst): keep the order
  uint64_t seq = 0;
  const Clock::time_point t0 = Clock::now();
  std::vector<uint8_t> buf(65536);
  while (!g_stop && ms_since(t0) < max_s * 1000) {
    int wait_ms = 100;
    if (!queue.empty())
      wait_ms = int(std::clamp<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(queue.top().due - Clock::now()).count(), 0, 100));
    pollfd p{.fd = tun, .events = POLLIN, .revents = 0};
    ::poll(&p, 1, wait_ms);
    for (int burst = 0; burst < 256; ++burst) {  // read what is there, boundedly
      const ssize_t n = ::read(tun, buf.data(), buf.size());
      if (n <= 0) break;
      if (n < 20 || (buf[0] >> 4) != 4) continue;  // IPv4 only
      uint32_t src = 0, dst = 0;
      std::memcpy(&src, &buf[12], 4);
      std::memcpy(&dst, &buf[16], 4);
      src = ntohl(src), dst = ntohl(dst);
      const Link none;
      const Link& ls = link_of(src) ? *link_of(src) : none;
      const Link& ld = link_of(dst) ? *link_of(dst) : none;
      const double keep = (1 - ls.loss) * (1 - ld.loss);
      if (unit(rng) >= keep) continue;
      const double jitter = (ls.jitter_ms + ld.jitter_ms) * (2 * unit(rng) - 1);
      const double delay_ms = std::max(0.0, ls.delay_ms + ld.delay_ms + jitter);
      Clock::time_point due = Clock::now() + std::chrono::microseconds(int64_t(delay_ms * 1000));
      auto& last = last_due[{src, dst}];
      due = std::max(due, last);
      last = due;
      queue.push(Held{due, seq++, std::vector<uint8_t>(buf.begin(), buf.begin() + n)});
    }
    while (!queue.empty() && queue.top().due <= Clock::now()) {
      const Held& h = queue.top();
      (void)!::write(tun, h.bytes.data(), h.bytes.size());  // a full queue drops it, as a link would
      queue.pop();
    }
  }
  return 0;
}

int echo(const Args& a) {
  const int port = std::atoi(a.get("port", "0").c_str());
  const double max_s = std::atof(a.get("max-s", "900").c_str());
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(uint16_t(port));
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0)
    die("echo: cannot bind port " + std::to_string(port) + ": " + std::strerror(errno));
  std::printf("ready\n");
  std::fflush(stdout);
  const Clock::time_point t0 = Clock::now();
  char buf[2048];
  while (!g_stop && ms_since(t0) < max_s * 1000) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    sockaddr_in from{};
    socklen_t len = sizeof from;
    const ssize_t n = ::recvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
    if (n > 0) ::sendto(fd, buf, size_t(n), 0, reinterpret_cast<sockaddr*>(&from), len);
  }
  return 0;
}

int probe(const Args& a) {
  const int count = std::atoi(a.get("count", "10").c_str());
  const int interval_ms = std::atoi(a.get("interval-ms", "2").c_str());
  const int wait_ms = std::atoi(a.get("wait-ms", "2000").c_str());
  if (count < 1 || count > 1000000 || interval_ms < 0 || wait_ms < 0) die("probe: bad --count/--interval-ms/--wait-ms");
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(uint16_t(std::atoi(a.get("port", "0").c_str())));
  if (::inet_pton(AF_INET, a.get("to").c_str(), &to.sin_addr) != 1) die("probe: bad --to " + a.get("to"));
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0)
    die(std::string("probe: connect: ") + std::strerror(errno));
  std::vector<Clock::time_point> sent_at(static_cast<size_t>(count));
  std::vector<double> rtt;
  std::vector<bool> seen(static_cast<size_t>(count), false);
  auto drain = [&](int timeout_ms) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    while (::poll(&p, 1, timeout_ms) > 0) {
      uint32_t i = 0;
      if (::recv(fd, &i, sizeof i, 0) == sizeof i && i < uint32_t(count) && !seen[i]) {
        seen[i] = true;
        rtt.push_back(ms_since(sent_at[i]));
      }
      timeout_ms = 0;
    }
  };
  for (int i = 0; i < count; ++i) {
    sent_at[size_t(i)] = Clock::now();
    const uint32_t n = uint32_t(i);
    (void)!::send(fd, &n, sizeof n, 0);  // an unreachable host's error counts as a loss
    const Clock::time_point next = sent_at[size_t(i)] + std::chrono::milliseconds(interval_ms);
    while (Clock::now() < next) drain(int(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                     next - Clock::now()).count())));
  }
  const Clock::time_point end = Clock::now() + std::chrono::milliseconds(wait_ms);
  while (Clock::now() < end && rtt.size() < size_t(count))
    drain(int(std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count()) + 1);
  std::sort(rtt.begin(), rtt.end());
  std::printf("{\"sent\": %d, \"received\": %zu, \"rtt_ms_median\": %.3f, \"rtt_ms_min\": %.3f}\n", count, rtt.size(),
              rtt.empty() ? -1.0 : rtt[rtt.size() / 2], rtt.empty() ? -1.0 : rtt.front());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) die("usage: atoll_netem forward|echo|probe --flag value ...");
  // It outlives the script that starts it (`emulated_hosts.sh up`): --max-s bounds it, and
  // `emulated_hosts.sh down` kills every process of the namespaces.
  ::signal(SIGTERM, on_signal);
  ::signal(SIGINT, on_signal);
  const Args a = parse(argc, argv, 2);
  const std::string cmd = argv[1];
  if (cmd == "forward") return forward(a);
  if (cmd == "echo") return echo(a);
  if (cmd == "probe") return probe(a);
  die("unknown subcommand " + cmd);
}
