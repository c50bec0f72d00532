#include "atoll/supervise/doctor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "atoll/core/errors.h"
#include "atoll/core/user_path.h"
#include "atoll/dist/run_token.h"
#include "atoll/dist/store.h"
#include "atoll/dist/store_probe.h"
#include "atoll/engine/memory_estimate.h"
#include "atoll/supervise/doctor_peers.h"
#include "atoll/train/state_registry.h"

namespace atl {

namespace {

namespace fs = std::filesystem;
using Ms = std::chrono::milliseconds;

// Beyond this the clocks' difference is worth a warning: events.jsonl rows written on different
// hosts (each its own wall clock) would be out of order by more than a heartbeat's renewal.
constexpr double kClockWarnS = 2.0;

std::string fixed(double x, const char* format = "%.3g") {
  char s[64];
  std::snprintf(s, sizeof s, format, x);
  return s;
}

std::string seconds(Ms d) { return fixed(double(d.count()) / 1000) + " s"; }

// The findings of one run of the checks, and what later checks need from earlier ones.
struct Doctor {
  const DoctorOptions& o;
  StoreAddress store = {};
  bool store_parsed = false, store_ok = false;
  std::optional<StoreProbe> probe = {};
  std::string listen_address = {};
  int listen_fd = -1;
  int listen_port = 0;

  ~Doctor() {
    if (listen_fd >= 0) ::close(listen_fd);
  }
  void say(Verdict v, const std::string& check, const std::string& found, const std::string& fix = "") const {
    o.report({.verdict = v, .check = check, .found = found, .fix = fix});
  }

  void check_store();
  void check_interface();
  void check_port();
  void check_clock();
  void check_token();
  void check_disk();
  void check_peers();
};

void Doctor::check_store() {
  if (o.store_url.empty()) return say(Verdict::kFail, "store", "no store given", "pass --store redis://HOST:PORT");
  try {
    store = parse_store_url(o.store_url);
  } catch (const ConfigError& e) {
    return say(Verdict::kFail, "store", e.what());
  }
  store_parsed = true;
  if (!o.store_password.empty()) store.password = o.store_password;
  probe = probe_store(store, o.timeout);
  const std::string url = store.url();
  using Auth = StoreProbe::Auth;
  const std::string where = o.password_from.empty() ? "" : " from " + o.password_from;
  if (!probe->reached)
    return say(Verdict::kFail, "store", url + " unreachable within " + seconds(o.timeout) + " (" + probe->error + ")",
               "start redis-server there, or give the store's address with --store redis://HOST:PORT (a firewall "
               "must let this host reach port " + std::to_string(store.port) + ")");
  if (probe->auth == Auth::kRefused)
    return say(Verdict::kFail, "store", url + " refused the password" + where + " (" + probe->error + ")",
               "set ATOLL_STORE_PASSWORD to the store's password (its requirepass; a launched run's "
               "RUN_DIR/store.password), or unset it for a store without one");
  if (probe->auth == Auth::kRequired)
    return say(Verdict::kFail, "store", url + " requires a password and none was given (" + probe->error + ")",
               "export ATOLL_STORE_PASSWORD=<the store's password> on this host (never on a command line)");
  if (!probe->answers)
    return say(Verdict::kFail, "store", url + ": " + probe->error, "point --store at the Redis server's host and port");
  store_ok = true;
  const std::string found = url + " answers (connected in " + fixed(probe->connect_ms, "%.1f") + " ms)";
  if (probe->auth == Auth::kAccepted) return say(Verdict::kPass, "store", found + ", password" + where + " accepted");
  say(Verdict::kWarn, "store", found + " without a password: anyone who reaches it can write the run's keys",
      "start redis-server with requirepass (docs/cluster.md's sbatch script) and give every host ATOLL_STORE_PASSWORD");
}

void Doctor::check_interface() {
  if (!store_parsed) return say(Verdict::kSkip, "interface", "not checked: it is chosen by the route to the store");
  try {
    const ListenAddress a = o.choose_interface();
    listen_address = a.address;
    say(Verdict::kPass, "interface", a.address + " (" + (a.iface.empty() ? "no interface" : a.iface) + ", " + a.why + ")");
  } catch (const ConfigError& e) {
    say(Verdict::kFail, "interface", e.what());
  }
}

// Gloo's pairs bind the listen address with port 0: the kernel picks from its ephemeral range.
void Doctor::check_port() {
  if (listen_address.empty()) return say(Verdict::kSkip, "port", "not checked: no listen address");
  std::string range = "?";
  if (std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range"); in) {
    int lo = 0, hi = 0;
    if (in >> lo >> hi) range = std::to_string(lo) + "-" + std::to_string(hi);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, listen_address.c_str(), &a.sin_addr);
  listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t len = sizeof a;
  if (listen_fd < 0 || ::bind(listen_fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(listen_fd, 64) != 0 || ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const std::string why = std::strerror(errno);
    if (listen_fd >= 0) ::close(listen_fd);
    listen_fd = -1;
    return say(Verdict::kFail, "port", "cannot listen on " + listen_address + " (" + why + ")",
               "name an interface whose address this host holds with --iface, or free a port in the kernel's range " + range);
  }
  listen_port = ntohs(a.sin_port);
  say(Verdict::kPass, "port", listen_address + ":" + std::to_string(listen_port) + " listens (the workers' Gloo pairs "
      "take ports the same way, from the kernel's range " + range + ": firewalls between the hosts must let it through; "
      "the store's port " + std::to_string(store.port) + " too)");
}

// Nothing of the run's fault handling reads one host's clock against another's: a heartbeat's
// expiry runs on the store's clock alone (Redis PX), and its liveness is read as a change of that
// expiry. What a skew does spoil is the record: events.jsonl's `time` from several hosts, and
// the launcher's view of heartbeat ages (its clock against the store's expiry times).
void Doctor::check_clock() {
  if (!store_ok) return say(Verdict::kSkip, "clock", "not checked: the store check failed");
  if (!probe->clock_offset_s) return say(Verdict::kWarn, "clock", "the store gave no answer to TIME", "");
  const double off = *probe->clock_offset_s;
  const std::string found = "this host's clock is " + fixed(std::fabs(off), "%.3f") + " s " +
                            (off >= 0 ? "behind" : "ahead of") + " the store's (± " +
                            fixed(probe->clock_error_s * 1000, "%.1f") + " ms)";
  if (std::fabs(off) <= kClockWarnS) return say(Verdict::kPass, "clock", found);
  say(Verdict::kWarn, "clock", found + ": heartbeats do not mind (their expiry runs on the store's clock), but times "
      "in events.jsonl from different hosts will be out of order",
      "synchronise the clocks (chrony or systemd-timesyncd on every host)");
}

void Doctor::check_token() {
  if (o.token_unreadable) return;  // reported with the placement
  if (!store_ok) return say(Verdict::kSkip, "run token", "not checked: the store check failed");
  const std::string given = o.token_from.empty() ? "" : " (from " + o.token_from + ")";
  const std::string run = "run '" + o.run_id + "'";
  const std::string fix_give = "give the run's token: ATOLL_RUN_TOKEN or --token-file RUN_DIR/run.token (written by "
                               "`atoll launch`, mode 0600)";
  RunTokenVerdict v;
  try {
    Store s(StoreOptions{.url = o.store_url, .password = o.store_password, .run_id = o.run_id, .timeout = o.timeout});
    v = judge_run_token(s, o.run_token);
  } catch (const Error& e) {
    return say(Verdict::kFail, "run token", std::string("could not read the store: ") + e.what());
  }
  using K = RunTokenVerdict::Kind;
  switch (v.kind) {
    case K::kMatches: return say(Verdict::kPass, "run token", "the token" + given + " is " + run + "'s on the store");
    case K::kNoneGiven:
      return say(Verdict::kFail, "run token", run + " is on the store with a token, and none was given: a worker "
                 "would be refused", fix_give);
    case K::kWrong:
      return say(Verdict::kFail, "run token", "the token" + given + " is not the token of " + run + " on the store: a "
                 "worker would be refused", fix_give + ", or check --run-id");
    case K::kRunWithoutToken:
      return say(Verdict::kWarn, "run token", run + " is on the store without a token: any process that reaches the "
                 "store may join it", "start runs with ATOLL_RUN_TOKEN set on every host");
    case K::kOtherRuns:
      return say(Verdict::kFail, "run token", run + " is not on the store, and the token" + given + " is run '" +
                 v.other_run + "''s", "--run-id " + v.other_run + " to join that run (a new run needs a token of its own)");
    case K::kNewRun: break;
  }
  if (o.run_token.empty())
    return say(Verdict::kWarn, "run token", "none given, and " + run + " is not on the store yet: the run would "
               "admit any process that reaches the store",
               "export ATOLL_RUN_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n') once and give the "
               "same to every host");
  say(Verdict::kPass, "run token", run + " is not on the store yet: the first worker's token stands; this one" + given +
      " must be every host's");
}

// Bytes of the files under `dir` (missing: 0).
double bytes_under(const fs::path& dir) {
  double total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) total += double(it->file_size(ec));
  return total;
}

// The checkpoints at a save's peak: checkpoint.keep of them plus the one being written (the
// oldest goes once the new one is committed), less what the run's folder holds already.
void Doctor::check_disk() {
  if (o.config == nullptr) return say(Verdict::kSkip, "disk", "not checked: the config did not load");
  const std::string dir = o.run_dir.empty() ? "runs" : o.run_dir;
  try {
    check_output_dir(dir, "--run-dir");
  } catch (const ConfigError& e) {
    return say(Verdict::kFail, "disk", e.what());
  }
  fs::path at = fs::absolute(dir);
  std::error_code ec;
  while (!fs::exists(at, ec) && at.has_parent_path() && at != at.parent_path()) at = at.parent_path();
  struct statvfs st {};
  if (::statvfs(at.c_str(), &st) != 0)
    return say(Verdict::kFail, "disk", "cannot read the free space of " + at.string() + " (" + std::strerror(errno) + ")");
  if (::access(at.c_str(), W_OK) != 0)
    return say(Verdict::kFail, "disk", at.string() + " is not writable by this user (" + std::strerror(errno) + ")",
               "pick a --run-dir this user may write, or fix its permissions");
  const double free = double(st.f_bavail) * double(st.f_frsize);
  const double one = checkpoint_bytes_estimate(*o.config, o.islands, o.workers_per_island);
  const int copies = o.config->checkpoint.keep + 1;
  const double held = bytes_under(fs::path(dir) / "checkpoints");
  const double need = std::max(one, one * copies - held);
  const std::string found =
      dir + ": " + bytes_text(free) + " free; a checkpoint of this config (" + std::to_string(o.islands) +
      " island(s) x " + std::to_string(o.workers_per_island) + " worker(s)) is " + bytes_text(one) + ", " +
      std::to_string(copies) + " at a save's peak (checkpoint.keep " + std::to_string(copies - 1) +
      " + the one being written)" + (held > 0 ? ", " + bytes_text(held) + " of them there already" : "") +
      ": " + bytes_text(need) + " more";
  const std::string fix = "free space there, pick a --run-dir on a larger file system, or lower checkpoint.keep";
  if (free < need) return say(Verdict::kFail, "disk", found + ": it does not fit", fix);
  if (free < 2 * need) return say(Verdict::kWarn, "disk", found + ": less than twice that is free", fix);
  say(Verdict::kPass, "disk", found);
}

void Doctor::check_peers() {
  if (o.peers <= 1)
    return say(Verdict::kPass, "peers", "--peers 1: no other host to try (start `atoll doctor` on every host of the "
               "run at once, with the same --run-id and --peers N, to try the links between them)");
  if (!store_ok || listen_fd < 0)
    return say(Verdict::kSkip, "peers", std::string("not checked: ") + (store_ok ? "no port to listen on" : "the store check failed"));
  PeerMeeting m;
  try {
    Store s(StoreOptions{.url = o.store_url, .password = o.store_password, .run_id = o.run_id, .timeout = o.timeout});
    m = meet_peers(s, {.run_id = o.run_id, .who = o.who, .address = listen_address, .port = listen_port,
                       .listen_fd = listen_fd, .peers = o.peers, .wait = o.peers_wait, .connect_timeout = o.timeout});
  } catch (const Error& e) {
    return say(Verdict::kFail, "peers", std::string("the store failed during the meeting: ") + e.what());
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : "; ") + x;
    return s;
  };
  const int others = m.met - 1;
  std::string found = "met " + std::to_string(others) + " of " + std::to_string(o.peers - 1) + " other doctor(s) of run '" +
                      o.run_id + "' within " + seconds(o.peers_wait);
  if (!m.reached.empty()) found += "; reached " + list(m.reached);
  if (!m.unreached.empty()) found += "; could not reach " + list(m.unreached);
  if (!m.unreached_by.empty()) found += "; not reached by " + list(m.unreached_by) + " (at " + listen_address + ")";
  if (!m.silent.empty()) found += "; no report from " + list(m.silent);
  if (!m.unreached.empty() || !m.unreached_by.empty())
    return say(Verdict::kFail, "peers", found, "let TCP through between the hosts' listen addresses (the kernel's "
               "port range, see the port line), or name the interface that reaches the other hosts with --iface");
  if (others < o.peers - 1 || !m.silent.empty())
    return say(Verdict::kFail, "peers", found, "start `atoll doctor` on every host at once with the same --run-id and "
               "store, and --peers the number started (--wait S waits longer)");
  say(Verdict::kPass, "peers", found + "; every one reached this host at " + listen_address + ":" + std::to_string(listen_port));
}

}  // namespace

std::string doctor_line_text(const DoctorLine& line) {
  static const char* const names[] = {"PASS", "WARN", "FAIL", "SKIP"};
  return std::string(names[int(line.verdict)]) + " " + line.check + ": " + line.found +
         (line.fix.empty() ? "" : "; fix: " + line.fix);
}

void run_doctor_checks(const DoctorOptions& opts) {
  Doctor d{.o = opts};
  d.check_store();
  d.check_interface();
  d.check_port();
  d.check_clock();
  d.check_token();
  d.check_disk();
  d.check_peers();
}

}  // namespace atl
