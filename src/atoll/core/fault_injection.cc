// ATOLL_FAULT (see fault_injection.h).
#include "atoll/core/fault_injection.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <iterator>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <vector>

#include "atoll/core/errors.h"

namespace atl {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream ss(s);
  std::string p;
  while (std::getline(ss, p, sep)) parts.push_back(p);
  return parts;
}

[[noreturn]] void refuse(const std::string& text, const std::string& problem) {
  throw ConfigError("ATOLL_FAULT='" + text + "': " + problem +
                    "; fix: write ACTION:island=I[:rank=R]:outer_step=S:ring_chunk=K, ACTION:island=I:transfer=K, "
                    "ACTION:island=I:admission=K, ACTION:island=I[:rank=R]:join=start or "
                    "ACTION:island=I[:rank=R]:ckpt=POINT[:save=K] (POINT copy, tensor, "
                    "part, manifest, rename or latest), or "
                    "corrupt:island=I:outer_step=S:update=nan|scale|flip|replay, delay:island=I:outer_step=S:seconds=X, "
                    "delay:island=I[:rank=R]:ckpt=copy[:save=K]:seconds=X, "
                    "stall:island=I:step=K:seconds=X or corrupt:island=I:step=K:loss=nan|spike, "
                    "with ACTION kill, hang, crash or corrupt "
                    "(corrupt with transfer, ring_chunk or update only), several joined by commas, or unset ATOLL_FAULT");
}

int64_t positive(const std::string& text, const std::string& key, const std::string& value, int64_t min) {
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < min)
    refuse(text, key + "=" + value + " is not a whole number >= " + std::to_string(min));
  return v;
}

FaultSpec::Update parse_update(const std::string& text, const std::string& value) {
  if (value == "nan") return FaultSpec::Update::kNan;
  if (value == "scale") return FaultSpec::Update::kScale;
  if (value == "flip") return FaultSpec::Update::kFlip;
  if (value == "replay") return FaultSpec::Update::kReplay;
  refuse(text, "update=" + value + " is not nan, scale, flip or replay");
}

// The armed faults (set once, before any point runs); each fires once.
struct Armed {
  FaultSpec spec;
  std::atomic<bool> fired{false};
};
std::atomic<bool> g_armed{false};
std::vector<std::unique_ptr<Armed>> g_faults;
std::atomic<int64_t> g_outer_step{-1}, g_ring_messages{0}, g_transfers{0}, g_saves{0}, g_admissions{0};
const char* const kCheckpointPoints[] = {"copy", "tensor", "part", "manifest", "rename", "latest"};

void say(const std::string& what) {
  const std::string line = "ATOLL_FAULT: " + what + "\n";
  [[maybe_unused]] ssize_t n = ::write(2, line.data(), line.size());
}

// Kill or hang here; false for corrupt (the caller corrupts). Fires once.
bool fire(Armed& a, const std::string& where) {
  if (a.fired.exchange(true)) return false;
  if (a.spec.action == FaultSpec::Action::kCorrupt) {
    say("corrupting " + where);
    return true;
  }
  if (a.spec.action == FaultSpec::Action::kDelay || a.spec.action == FaultSpec::Action::kStall) {
    say("sleeping " + std::to_string(a.spec.seconds) + " s at " + where);
    const double s = a.spec.seconds;
    timespec t{.tv_sec = time_t(s), .tv_nsec = long((s - double(time_t(s))) * 1e9)};
    while (::nanosleep(&t, &t) != 0) {
    }
    return false;
  }
  if (a.spec.action == FaultSpec::Action::kCrash) {
    say("SIGKILL to the parent and itself at " + where);
    ::kill(::getppid(), SIGKILL);
    ::raise(SIGKILL);
  }
  say((a.spec.action == FaultSpec::Action::kKill ? "SIGKILL at " : "SIGSTOP at ") + where);
  ::raise(a.spec.action == FaultSpec::Action::kKill ? SIGKILL : SIGSTOP);
  return false;
}

}  // namespace

FaultSpec parse_fault_spec(const std::string& text) {
  FaultSpec f;
  if (text.empty()) return f;
  const std::vector<std::string> parts = split(text, ':');
  const std::string& action = parts[0];
  if (action == "kill") f.action = FaultSpec::Action::kKill;
  else if (action == "hang") f.action = FaultSpec::Action::kHang;
  else if (action == "corrupt") f.action = FaultSpec::Action::kCorrupt;
  else if (action == "crash") f.action = FaultSpec::Action::kCrash;
  else if (action == "delay") f.action = FaultSpec::Action::kDelay;
  else if (action == "stall") f.action = FaultSpec::Action::kStall;
  else refuse(text, "unknown action '" + action + "'");
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    if (eq == std::string::npos) refuse(text, "'" + parts[i] + "' is not key=value");
    const std::string key = parts[i].substr(0, eq), value = parts[i].substr(eq + 1);
    if (key == "island") f.island = int(positive(text, key, value, 0));
    else if (key == "rank") f.rank = int(positive(text, key, value, 0));
    else if (key == "outer_step") f.outer_step = positive(text, key, value, 1);
    else if (key == "ring_chunk") f.ring_chunk = positive(text, key, value, 1);
    else if (key == "transfer") f.transfer = positive(text, key, value, 1);
    else if (key == "admission") f.admission = positive(text, key, value, 1);
    else if (key == "save") f.save = positive(text, key, value, 1);
    else if (key == "join") {
      if (value != "start") refuse(text, "join=" + value + " is not start");
      f.join = true;
    }
    else if (key == "ckpt") {
      if (std::find(std::begin(kCheckpointPoints), std::end(kCheckpointPoints), value) == std::end(kCheckpointPoints))
        refuse(text, "ckpt=" + value + " is not a checkpoint point");
      f.ckpt = value;
    } else if (key == "update") f.update = parse_update(text, value);
    else if (key == "step") f.step = positive(text, key, value, 1);
    else if (key == "seconds") f.seconds = double(positive(text, key, value, 0));
    else if (key == "loss") {
      if (value != "nan" && value != "spike") refuse(text, "loss=" + value + " is not nan or spike");
      f.loss = value == "nan" ? FaultSpec::Loss::kNan : FaultSpec::Loss::kSpike;
    } else {
      refuse(text, "unknown key '" + key +
                       "' (island, rank, outer_step, ring_chunk, transfer, admission, join, ckpt, save, update, step, seconds, loss)");
    }
  }
  if (f.island < 0) refuse(text, "no island=I");
  if (f.join) {
    if ((f.action != FaultSpec::Action::kKill && f.action != FaultSpec::Action::kHang) || f.outer_step > 0 ||
        f.ring_chunk > 0 || f.transfer > 0 || f.admission > 0 || !f.ckpt.empty() || f.step > 0 || f.seconds > 0 ||
        f.update != FaultSpec::Update::kNone || f.loss != FaultSpec::Loss::kNone)
      refuse(text, "join=start goes with kill or hang, alone");
    return f;
  }
  const bool timed = f.action == FaultSpec::Action::kDelay || f.action == FaultSpec::Action::kStall;
  const bool others = f.ring_chunk > 0 || f.transfer > 0 || f.admission > 0 || !f.ckpt.empty() ||
                      f.update != FaultSpec::Update::kNone;
  if (timed != (f.seconds > 0)) refuse(text, "seconds=X (above 0) goes with delay and stall");
  if (f.action == FaultSpec::Action::kDelay) {
    const bool copy = f.ckpt == "copy" && f.outer_step < 0 && f.ring_chunk < 0 && f.transfer < 0 &&
                      f.admission <= 0 && f.update == FaultSpec::Update::kNone;
    if (f.step > 0 || (!copy && (f.outer_step < 0 || others)))
      refuse(text, "delay takes outer_step=S:seconds=X alone (or ckpt=copy[:save=K]:seconds=X)");
    return f;
  }
  if (f.action == FaultSpec::Action::kStall) {
    if (f.step < 0 || f.outer_step > 0 || others) refuse(text, "stall takes step=K:seconds=X alone");
    return f;
  }
  if (f.loss != FaultSpec::Loss::kNone || f.step > 0) {
    if (f.action != FaultSpec::Action::kCorrupt || f.loss == FaultSpec::Loss::kNone || f.step < 0 || f.outer_step > 0 ||
        others)
      refuse(text, "loss=... goes with corrupt and takes step=K alone");
    return f;
  }
  if (f.update != FaultSpec::Update::kNone) {
    if (f.action != FaultSpec::Action::kCorrupt) refuse(text, "update=... goes with corrupt");
    if (f.outer_step < 0 || f.ring_chunk > 0 || f.transfer > 0 || f.admission > 0 || !f.ckpt.empty())
      refuse(text, "update=... takes outer_step=S alone");
    return f;
  }
  const bool ring = f.ring_chunk > 0 || f.outer_step > 0;
  if (ring && (f.ring_chunk < 0 || f.outer_step < 0)) refuse(text, "outer_step and ring_chunk go together");
  if (int(ring) + int(f.transfer > 0) + int(f.admission > 0) + int(!f.ckpt.empty()) != 1)
    refuse(text, "name one point: outer_step=S:ring_chunk=K, transfer=K, admission=K or ckpt=POINT");
  if (f.action == FaultSpec::Action::kCorrupt && f.transfer <= 0 && !ring)
    refuse(text, "corrupt applies to state transfers (transfer=K), ring messages (outer_step=S:ring_chunk=K) and "
                 "updates (update=...) only");
  return f;
}

std::vector<FaultSpec> parse_fault_specs(const std::string& text) {
  std::vector<FaultSpec> specs;
  for (const std::string& part : split(text, ','))
    if (const FaultSpec f = parse_fault_spec(part); f.action != FaultSpec::Action::kNone) specs.push_back(f);
  return specs;
}

void arm_fault_injection(int island, int rank, bool join) {
  const char* env = std::getenv("ATOLL_FAULT");
  g_armed = false;
  g_faults.clear();
  for (const FaultSpec& f : parse_fault_specs(env ? env : ""))
    if (f.island == island && (f.rank < 0 || f.rank == rank) && f.join == join) {
      g_faults.push_back(std::make_unique<Armed>());
      g_faults.back()->spec = f;
    }
  g_armed = !g_faults.empty();
}

void disarm_fault_injection() { g_armed = false; }

void fault_outer_step(int64_t outer_step) {
  g_outer_step = outer_step;
  g_ring_messages = 0;
}

FaultSpec::Update fault_update() {
  if (!g_armed.load(std::memory_order_relaxed)) return FaultSpec::Update::kNone;
  for (auto& a : g_faults)
    if (a->spec.update != FaultSpec::Update::kNone && a->spec.outer_step == g_outer_step &&
        fire(*a, "the update of outer step " + std::to_string(a->spec.outer_step)))
      return a->spec.update;
  return FaultSpec::Update::kNone;
}

bool fault_update_armed() {
  if (!g_armed.load(std::memory_order_relaxed)) return false;
  for (auto& a : g_faults)
    if (a->spec.update != FaultSpec::Update::kNone && !a->fired) return true;
  return false;
}

bool fault_ring_message() {
  if (!g_armed.load(std::memory_order_relaxed)) return false;
  const int64_t k = ++g_ring_messages;
  bool corrupt = false;
  for (auto& a : g_faults)
    if (a->spec.ring_chunk == k && a->spec.outer_step == g_outer_step && a->spec.update == FaultSpec::Update::kNone)
      corrupt = fire(*a, "outer step " + std::to_string(a->spec.outer_step) + ", ring message " + std::to_string(k)) ||
                corrupt;
  return corrupt;
}

bool fault_transfer_tensor() {
  if (!g_armed.load(std::memory_order_relaxed)) return false;
  const int64_t k = ++g_transfers;
  bool corrupt = false;
  for (auto& a : g_faults)
    if (a->spec.transfer == k) corrupt = fire(*a, "state transfer tensor " + std::to_string(k)) || corrupt;
  return corrupt;
}

void fault_admission() {
  if (!g_armed.load(std::memory_order_relaxed)) return;
  const int64_t k = ++g_admissions;
  for (auto& a : g_faults)
    if (a->spec.admission == k) fire(*a, "admission " + std::to_string(k) + ", before its group's rendezvous");
}

void fault_before_exchange(int64_t outer_step) {
  if (!g_armed.load(std::memory_order_relaxed)) return;
  for (auto& a : g_faults)
    if (a->spec.action == FaultSpec::Action::kDelay && a->spec.ckpt.empty() && a->spec.outer_step == outer_step)
      fire(*a, "the exchange of outer step " + std::to_string(a->spec.outer_step));
}

void fault_step(int64_t step) {
  if (!g_armed.load(std::memory_order_relaxed)) return;
  for (auto& a : g_faults)
    if (a->spec.action == FaultSpec::Action::kStall && a->spec.step == step)
      fire(*a, "inner step " + std::to_string(step));
}

double fault_loss(int64_t step, double loss) {
  if (!g_armed.load(std::memory_order_relaxed)) return loss;
  for (auto& a : g_faults)
    if (a->spec.loss != FaultSpec::Loss::kNone && a->spec.step == step &&
        fire(*a, "the loss of inner step " + std::to_string(step)))
      return a->spec.loss == FaultSpec::Loss::kNan ? std::nan("") : loss * 1e3;
  return loss;
}

void fault_join_start() {
  if (!g_armed.load(std::memory_order_relaxed)) return;
  for (auto& a : g_faults)
    if (a->spec.join) fire(*a, "the start of a restart (--join)");
}

void fault_checkpoint_save() { ++g_saves; }

void fault_checkpoint(const char* point) {
  if (!g_armed.load(std::memory_order_relaxed)) return;
  for (auto& a : g_faults)
    if (a->spec.ckpt == point && a->spec.save == g_saves)
      fire(*a, std::string("checkpoint save ") + std::to_string(a->spec.save) + ", point " + point);
}

}  // namespace atl
