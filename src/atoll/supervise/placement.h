// Where `atoll worker` sits in a run when a scheduler started it (docs/cluster.md): its island
// and rank, the run's shape, the store and the run id, read from the environment a scheduler
// gives each task, so that one command line serves every task of a job.
//
// Sources, the most specific first (torchrun inside a Slurm job sets both, and RANK is the
// worker's own): torchrun-style RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (and
// TORCHELASTIC_RUN_ID); a Kubernetes Indexed Job's JOB_COMPLETION_INDEX (one pod per worker; the
// pod count is not in its environment, so --islands is needed); Slurm's SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST (a hostlist such as node[01-03,07],gpu5),
// SLURMD_NODENAME and SLURM_JOB_ID.
//
// Task t of W = N·M is island t / M, rank t % M (the global worker index w = I·M + R of
// train/island_trainer.h). Flags given on the command line win over the environment.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace atl {

// The hosts a Slurm hostlist names, in order: comma-separated items, each a name with any number
// of bracketed ranges, "node[01-03,07]" -> node01 node02 node03 node07 (a range keeps its lower
// bound's digits, so zero padding stays), "r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2. A malformed list
// (unmatched bracket, empty item, a range that is not digits or runs backwards, more than a
// million hosts) is a ConfigError naming it.
std::vector<std::string> expand_hostlist(std::string_view hostlist);

// What a scheduler's environment says about this task. `source` is "" when no scheduler
// variable is set.
struct SchedulerEnv {
  std::string source;              // "torchrun", "kubernetes" or "slurm"
  std::string task_var, tasks_var;  // the variables read, for messages: "SLURM_PROCID", "SLURM_NTASKS"
  int task = -1;                   // this task's global index
  int tasks = -1;                  // the job's task count; -1 when the source does not say (Kubernetes)
  int local_task = -1;             // index among the tasks on this host; -1 when not given
  std::string node;                // this host's name as the scheduler knows it ("" = not given)
  std::vector<std::string> nodes;  // the job's hosts (Slurm)
  std::string store_url;           // redis://MASTER_ADDR:MASTER_PORT, or Slurm's first host:6379; "" = none
  std::string run_id;              // slurm-<SLURM_JOB_ID>, TORCHELASTIC_RUN_ID; "" = none
};

using EnvLookup = std::function<const char*(const char*)>;  // getenv, or a test's table

// Reads the variables above; a variable that is set but malformed (not a whole number, a task
// beyond the count, a bad hostlist) is a ConfigError naming it and its value.
SchedulerEnv read_scheduler_env(const EnvLookup& env);

// The command line's placement flags; nullopt = not given. first_island, when given (0 too):
// this job's tasks are islands first_island, first_island + 1, ... of the run, a part of it (a
// site whose scheduler numbers its own tasks from 0, while other sites hold the other islands);
// not given: the job's tasks are the whole run.
struct PlacementFlags {
  std::optional<int> island{}, rank{}, islands{}, workers_per_island{}, first_island{};
};

struct Placement {
  int island = 0, rank = 0, islands = 1, workers_per_island = 1;
  std::string from;  // "flags" or the scheduler source
};

// The worker's placement: --island and --rank when given (both, or neither), else the
// scheduler's task index (task t: island first_island + t / M, rank t % M). --islands defaults
// to the scheduler's task count / M. A task count that is not --islands × --workers-per-island
// (with --first-island K, 0 too: not a multiple of M, or more than the islands from K on), an index
// outside the run, or no placement at all is a ConfigError naming the variables and flags and
// the fix.
Placement resolve_placement(const PlacementFlags& flags, const SchedulerEnv& env);

// One line for the log: "placement: island 1 rank 0 of 2 islands x 1 worker (slurm: task 1 of 2,
// local task 0 on node02 of node[01-02])".
std::string describe_placement(const Placement& p, const SchedulerEnv& env);

}  // namespace atl
