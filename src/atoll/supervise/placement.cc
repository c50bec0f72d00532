#include "atoll/supervise/placement.h"

#include <cctype>
#include <cstdint>
#include <string>

#include "atoll/core/errors.h"

namespace atl {

namespace {

constexpr size_t kMaxHosts = 1'000'000;  // far beyond any allocation; bounds a hostlist like n[0-999999999]
constexpr int kRedisPort = 6379;         // the port of the store a Slurm job starts on its first host

[[noreturn]] void bad_hostlist(std::string_view list, const std::string& why) {
  throw ConfigError("hostlist '" + std::string(list) + "': " + why +
                    "; fix: write it as Slurm does, e.g. node[01-03,07],gpu5");
}

bool all_digits(std::string_view s) {
  if (s.empty() || s.size() > 9) return false;  // 9 digits stay within an int
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// The expansions of one item (no top-level comma), appended to `out`: the first bracket's
// numbers, each followed by every expansion of the rest.
void expand_item(std::string_view list, std::string_view item, const std::string& prefix, std::vector<std::string>& out) {
  const size_t open = item.find('[');
  const size_t stray = item.find(']');
  if (open == std::string_view::npos) {
    if (stray != std::string_view::npos) bad_hostlist(list, "a ']' without its '['");
    out.push_back(prefix + std::string(item));
    return;
  }
  if (stray < open) bad_hostlist(list, "a ']' without its '['");
  const size_t close = item.find(']', open);
  if (close == std::string_view::npos) bad_hostlist(list, "a '[' without its ']'");
  const std::string head = prefix + std::string(item.substr(0, open));
  const std::string_view ranges = item.substr(open + 1, close - open - 1);
  const std::string_view rest = item.substr(close + 1);
  if (ranges.empty()) bad_hostlist(list, "empty brackets");
  size_t at = 0;
  while (at <= ranges.size()) {
    const size_t comma = std::min(ranges.find(',', at), ranges.size());
    const std::string_view range = ranges.substr(at, comma - at);
    const size_t dash = range.find('-');
    const std::string_view lo = range.substr(0, dash);
    const std::string_view hi = dash == std::string_view::npos ? lo : range.substr(dash + 1);
    const std::string quoted = std::string(1, '\'').append(range).append(1, '\'');  // (GCC 12 misreads "'" + string)
    if (!all_digits(lo) || !all_digits(hi)) bad_hostlist(list, quoted + " is not N or N-M");
    const long a = std::stol(std::string(lo)), b = std::stol(std::string(hi));
    if (b < a) bad_hostlist(list, "the range " + quoted + " runs backwards");
    if (out.size() + size_t(b - a + 1) > kMaxHosts) bad_hostlist(list, "more than a million hosts");
    for (long n = a; n <= b; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < lo.size()) digits = std::string(lo.size() - digits.size(), '0') + digits;
      expand_item(list, rest, head + digits, out);
      if (out.size() > kMaxHosts) bad_hostlist(list, "more than a million hosts");
    }
    at = comma + 1;
  }
}

// A variable that must be a whole number in [lo, hi] when set; nullopt when unset.
std::optional<int> whole_var(const EnvLookup& env, const char* name, int lo, int hi) {
  const char* v = env(name);
  if (v == nullptr) return std::nullopt;
  const std::string s = v;
  if (!all_digits(s) || std::stol(s) < lo || std::stol(s) > hi)
    throw ConfigError("the environment's " + std::string(name) + "=" + s + " is not a whole number from " +
                      std::to_string(lo) + " to " + std::to_string(hi) +
                      "; fix: start `atoll worker` from the scheduler's own launcher (srun, torchrun, a Kubernetes "
                      "Indexed Job), or unset it and give --island and --rank");
  return int(std::stol(s));
}

std::string str_var(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v == nullptr ? "" : v;
}

// The task index and count, read from `task_var` and `tasks_var` ("" when the source has no count).
void read_task(const EnvLookup& env, SchedulerEnv& s, const char* task_var, const char* tasks_var) {
  constexpr int kMax = 1 << 24;
  s.task_var = task_var;
  s.tasks_var = tasks_var;
  s.task = *whole_var(env, task_var, 0, kMax);
  if (*tasks_var != '\0') {
    const std::optional<int> n = whole_var(env, tasks_var, 1, kMax);
    if (!n)
      throw ConfigError(std::string(task_var) + " is set but " + tasks_var + " is not; fix: start `atoll worker` "
                        "from the scheduler's own launcher, which sets both");
    s.tasks = *n;
    if (s.task >= s.tasks)
      throw ConfigError("the environment's " + std::string(task_var) + "=" + std::to_string(s.task) + " is not below " +
                        tasks_var + "=" + std::to_string(s.tasks) + "; fix: start `atoll worker` from the scheduler's "
                        "own launcher, which numbers tasks 0.." + tasks_var + "-1");
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c != ',' || depth > 0) continue;
    const std::string_view item = list.substr(start, i - start);
    if (item.empty()) bad_hostlist(list, "an empty host name");
    expand_item(list, item, "", out);
    start = i + 1;
  }
  if (depth != 0) bad_hostlist(list, depth > 0 ? "a '[' without its ']'" : "a ']' without its '['");
  return out;
}

SchedulerEnv read_scheduler_env(const EnvLookup& env) {
  SchedulerEnv s;
  if (env("RANK") != nullptr) {
    s.source = "torchrun";
    read_task(env, s, "RANK", "WORLD_SIZE");
    s.local_task = whole_var(env, "LOCAL_RANK", 0, 1 << 24).value_or(-1);
    if (const std::string id = str_var(env, "TORCHELASTIC_RUN_ID"); !id.empty() && id != "none") s.run_id = id;
  } else if (env("JOB_COMPLETION_INDEX") != nullptr) {
    s.source = "kubernetes";
    read_task(env, s, "JOB_COMPLETION_INDEX", "");
    s.node = str_var(env, "HOSTNAME");
  } else if (env("SLURM_PROCID") != nullptr) {
    s.source = "slurm";
    read_task(env, s, "SLURM_PROCID", env("SLURM_NTASKS") != nullptr ? "SLURM_NTASKS" : "SLURM_NPROCS");
    s.local_task = whole_var(env, "SLURM_LOCALID", 0, 1 << 24).value_or(-1);
    s.node = str_var(env, "SLURMD_NODENAME");
    if (const std::string list = str_var(env, "SLURM_JOB_NODELIST"); !list.empty()) {
      try {
        s.nodes = expand_hostlist(list);
      } catch (const ConfigError& e) {
        throw ConfigError("the environment's SLURM_JOB_NODELIST: " + std::string(e.what()));
      }
      s.store_url = "redis://" + s.nodes.front() + ":" + std::to_string(kRedisPort);
    }
    if (const std::string id = str_var(env, "SLURM_JOB_ID"); !id.empty()) s.run_id = "slurm-" + id;
  }
  // MASTER_ADDR/MASTER_PORT name the store wherever they are set (sbatch scripts often set them).
  if (const std::string addr = str_var(env, "MASTER_ADDR"); !addr.empty()) {
    const std::optional<int> port = whole_var(env, "MASTER_PORT", 1, 65535);
    s.store_url = "redis://" + addr + ":" + std::to_string(port.value_or(kRedisPort));
  }
  return s;
}

Placement resolve_placement(const PlacementFlags& f, const SchedulerEnv& env) {
  Placement p;
  p.workers_per_island = f.workers_per_island.value_or(1);
  const int M = p.workers_per_island;
  const std::string shape = f.islands ? "--islands " + std::to_string(*f.islands) + " x --workers-per-island " +
                                            std::to_string(M) + " = " + std::to_string(int64_t(*f.islands) * M)
                                      : "";
  if (f.island.has_value() != f.rank.has_value())
    throw ConfigError(std::string(f.island ? "--island is given without --rank" : "--rank is given without --island") +
                      "; fix: give both, or neither to take the place from the scheduler (" +
                      (env.source.empty() ? "none found: no SLURM_PROCID, RANK or JOB_COMPLETION_INDEX" : env.source) + ")");
  if (f.island) {
    if (!f.islands) throw ConfigError("--islands is required with --island; fix: pass --islands N (islands in the run)");
    p = {.island = *f.island, .rank = *f.rank, .islands = *f.islands, .workers_per_island = M, .from = "flags"};
    return p;
  }
  if (env.source.empty())
    throw ConfigError("no placement: --island and --rank are not given and no scheduler set SLURM_PROCID, RANK or "
                      "JOB_COMPLETION_INDEX; fix: pass --island I --rank R --islands N, or start the worker with srun, "
                      "torchrun or as a Kubernetes Indexed Job (docs/cluster.md)");
  p.from = env.source;
  if (env.tasks < 0 && !f.islands)
    throw ConfigError("--islands is required with " + env.task_var + " (a " + env.source + " task does not say how many "
                      "tasks there are); fix: pass --islands N with N x --workers-per-island = the job's task count");
  // --first-island K (0 too): the job holds a part of the run, islands K..; without it, all.
  const bool part = f.first_island.has_value();
  const int K = f.first_island.value_or(0);
  if (part && !f.islands)
    throw ConfigError("--first-island " + std::to_string(K) + " needs --islands (the run's island count, over every "
                      "site); fix: pass --islands N");
  if (part && env.tasks >= 0 && (env.tasks % M != 0 || K + env.tasks / M > *f.islands))
    throw ConfigError("the " + env.source + " job has " + env.tasks_var + "=" + std::to_string(env.tasks) +
                      " tasks, which are not whole islands of --workers-per-island " + std::to_string(M) +
                      " from --first-island " + std::to_string(K) + " below --islands " + std::to_string(*f.islands) +
                      "; fix: start M tasks per island of this site, at most (N - K) x M");
  if (env.tasks >= 0 && !part) {
    if (f.islands && int64_t(*f.islands) * M != env.tasks)
      throw ConfigError("the " + env.source + " job has " + env.tasks_var + "=" + std::to_string(env.tasks) +
                        " tasks, but " + shape + "; fix: start " + std::to_string(int64_t(*f.islands) * M) +
                        " tasks (one per worker), or change --islands/--workers-per-island to match, or pass --first-island K "
                        "when this job holds only islands K.. of the run (one site of several)");
    if (!f.islands && env.tasks % M != 0)
      throw ConfigError("the " + env.source + " job has " + env.tasks_var + "=" + std::to_string(env.tasks) +
                        " tasks, not a multiple of --workers-per-island " + std::to_string(M) +
                        "; fix: start N x M tasks, one per worker");
  }
  p.islands = f.islands.value_or(env.tasks / M);
  if (int64_t(K) * M + env.task >= int64_t(p.islands) * M)
    throw ConfigError("the environment's " + env.task_var + "=" + std::to_string(env.task) +
                      (part ? " from --first-island " + std::to_string(K) : std::string()) + " is beyond the run's " +
                      shape + " workers; fix: start exactly that many tasks (a Kubernetes Job's completions and "
                      "parallelism), numbered from 0");
  p.island = K + env.task / M;
  p.rank = env.task % M;
  return p;
}

std::string describe_placement(const Placement& p, const SchedulerEnv& env) {
  std::string s = "placement: island " + std::to_string(p.island) + " rank " + std::to_string(p.rank) + " of " +
                  std::to_string(p.islands) + " island(s) x " + std::to_string(p.workers_per_island) + " worker(s) (";
  if (p.from == "flags") return s + "from the flags)";
  s += p.from + " " + env.task_var + "=" + std::to_string(env.task);
  if (env.tasks >= 0) s += " of " + env.tasks_var + "=" + std::to_string(env.tasks);
  if (env.local_task >= 0) s += ", local task " + std::to_string(env.local_task);
  if (!env.node.empty()) s += " on " + env.node;
  if (!env.nodes.empty()) {
    s += ", hosts ";
    for (size_t i = 0; i < env.nodes.size() && i < 8; ++i) s += (i ? "," : "") + env.nodes[i];
    if (env.nodes.size() > 8) s += ",... (" + std::to_string(env.nodes.size()) + ")";
  }
  return s + ")";
}

}  // namespace atl
