// A worker's place from a scheduler's environment (supervise/placement.h): Slurm hostlists,
// Slurm / torchrun / Kubernetes variables, flags that win, and every malformed input a clear
// ConfigError.
#include "atoll/supervise/placement.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "atoll/core/errors.h"

namespace atl {
namespace {

using Hosts = std::vector<std::string>;

TEST(Hostlist, ExpandsSlurmForms) {
  EXPECT_EQ(expand_hostlist("gpu5"), Hosts({"gpu5"}));
  EXPECT_EQ(expand_hostlist("node[01-03,07],gpu5"), Hosts({"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(expand_hostlist("a,b,c"), Hosts({"a", "b", "c"}));
  EXPECT_EQ(expand_hostlist("n[8-11]"), Hosts({"n8", "n9", "n10", "n11"}));      // no padding: widths grow
  EXPECT_EQ(expand_hostlist("n[098-101]"), Hosts({"n098", "n099", "n100", "n101"}));  // the lower bound's width
  EXPECT_EQ(expand_hostlist("r[1-2]n[1-2]"), Hosts({"r1n1", "r1n2", "r2n1", "r2n2"}));
  EXPECT_EQ(expand_hostlist("x[3]-ib"), Hosts({"x3-ib"}));
  EXPECT_EQ(expand_hostlist("node-a[1-2],node-b"), Hosts({"node-a1", "node-a2", "node-b"}));
  EXPECT_EQ(expand_hostlist("n[0-999]").size(), 1000u);
}

TEST(Hostlist, MalformedListsAreConfigErrors) {
  for (const char* bad : {"", "a,,b", "n[1-", "n]1[", "n[]", "n[a-b]", "n[3-1]", "n[1-2", "n[-2]", "n[0-999999999]",
                          "a[0-999]b[0-999]c[0-999]", "n[1-2]]"}) {
    SCOPED_TRACE(bad);
    try {
      expand_hostlist(bad);
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("fix"), std::string::npos) << e.what();
    }
  }
}

// A fake environment.
EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(SchedulerEnv, NoneWithoutSchedulerVariables) {
  const SchedulerEnv s = read_scheduler_env(env_of({{"HOME", "/root"}}));
  EXPECT_EQ(s.source, "");
  EXPECT_EQ(s.store_url, "");
}

TEST(SchedulerEnv, Slurm) {
  const SchedulerEnv s = read_scheduler_env(env_of({{"SLURM_PROCID", "3"},
                                                    {"SLURM_NTASKS", "4"},
                                                    {"SLURM_LOCALID", "1"},
                                                    {"SLURM_JOB_NODELIST", "node[01-02]"},
                                                    {"SLURMD_NODENAME", "node02"},
                                                    {"SLURM_JOB_ID", "1234"}}));
  EXPECT_EQ(s.source, "slurm");
  EXPECT_EQ(s.task, 3);
  EXPECT_EQ(s.tasks, 4);
  EXPECT_EQ(s.local_task, 1);
  EXPECT_EQ(s.node, "node02");
  EXPECT_EQ(s.nodes, Hosts({"node01", "node02"}));
  EXPECT_EQ(s.store_url, "redis://node01:6379");  // the first host's store
  EXPECT_EQ(s.run_id, "slurm-1234");
  // MASTER_ADDR/MASTER_PORT name the store when the batch script sets them.
  EXPECT_EQ(read_scheduler_env(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "n1"},
                                       {"MASTER_ADDR", "10.0.0.9"}, {"MASTER_PORT", "6390"}}))
                .store_url,
            "redis://10.0.0.9:6390");
}

TEST(SchedulerEnv, TorchrunWinsOverSlurm) {  // torchrun inside a Slurm job: RANK is the worker's own
  const SchedulerEnv s = read_scheduler_env(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"RANK", "5"},
                                                    {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "head"},
                                                    {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "none"}}));
  EXPECT_EQ(s.source, "torchrun");
  EXPECT_EQ(s.task, 5);
  EXPECT_EQ(s.tasks, 8);
  EXPECT_EQ(s.local_task, 1);
  EXPECT_EQ(s.store_url, "redis://head:29500");
  EXPECT_EQ(s.run_id, "");  // torchrun's placeholder id is no run id
  EXPECT_EQ(read_scheduler_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_RUN_ID", "job7"}})).run_id, "job7");
}

TEST(SchedulerEnv, KubernetesIndexedJob) {
  const SchedulerEnv s = read_scheduler_env(env_of({{"JOB_COMPLETION_INDEX", "2"}, {"HOSTNAME", "atoll-2"}}));
  EXPECT_EQ(s.source, "kubernetes");
  EXPECT_EQ(s.task, 2);
  EXPECT_EQ(s.tasks, -1);  // a pod is not told the completions
  EXPECT_EQ(s.node, "atoll-2");
}

TEST(SchedulerEnv, MalformedVariablesAreConfigErrorsNamingThem) {
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      {{{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}}, "SLURM_PROCID=x"},
      {{{"SLURM_PROCID", "-1"}, {"SLURM_NTASKS", "2"}}, "SLURM_PROCID=-1"},
      {{{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}}, "SLURM_NTASKS=2"},
      {{{"SLURM_PROCID", "0"}}, "SLURM_NPROCS"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}, "SLURM_NTASKS=0"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "n[1-"}}, "SLURM_JOB_NODELIST"},
      {{{"RANK", "1"}}, "WORLD_SIZE"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT=70000"},
      {{{"JOB_COMPLETION_INDEX", "99999999999"}}, "JOB_COMPLETION_INDEX"},
  };
  for (const auto& [vars, names] : cases) {
    SCOPED_TRACE(names);
    try {
      read_scheduler_env(env_of(vars));
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("fix"), std::string::npos) << e.what();
    }
  }
}

SchedulerEnv slurm(int task, int tasks) {
  return read_scheduler_env(env_of({{"SLURM_PROCID", std::to_string(task)}, {"SLURM_NTASKS", std::to_string(tasks)}}));
}

TEST(Placement, TaskIndexIsIslandTimesMPlusRank) {
  // 3 islands x 2 workers: task t is island t / 2, rank t % 2.
  for (int t = 0; t < 6; ++t) {
    const Placement p = resolve_placement({.workers_per_island = 2}, slurm(t, 6));
    EXPECT_EQ(p.island, t / 2);
    EXPECT_EQ(p.rank, t % 2);
    EXPECT_EQ(p.islands, 3);  // from the task count
    EXPECT_EQ(p.from, "slurm");
  }
  const Placement k = resolve_placement({.islands = 4}, read_scheduler_env(env_of({{"JOB_COMPLETION_INDEX", "3"}})));
  EXPECT_EQ(k.island, 3);
  EXPECT_EQ(k.islands, 4);
  EXPECT_NE(describe_placement(k, read_scheduler_env(env_of({{"JOB_COMPLETION_INDEX", "3"}}))).find("kubernetes"),
            std::string::npos);
}

TEST(Placement, FlagsWin) {
  const Placement p = resolve_placement({.island = 1, .rank = 0, .islands = 2}, slurm(0, 6));
  EXPECT_EQ(p.island, 1);
  EXPECT_EQ(p.islands, 2);  // the task count is not checked against flags that place the worker
  EXPECT_EQ(p.from, "flags");
  EXPECT_EQ(resolve_placement({.islands = 3, .workers_per_island = 2}, slurm(5, 6)).island, 2);
}

TEST(Placement, ASiteOfLaterIslandsCountsFromFirstIsland) {
  // Site B holds islands 2 and 3 of 5, two workers each: its tasks 0..3.
  for (int t = 0; t < 4; ++t) {
    const Placement p = resolve_placement({.islands = 5, .workers_per_island = 2, .first_island = 2}, slurm(t, 4));
    EXPECT_EQ(p.island, 2 + t / 2);
    EXPECT_EQ(p.rank, t % 2);
    EXPECT_EQ(p.islands, 5);
  }
}

TEST(Placement, FirstIslandZeroIsASiteOfTheFirstIslands) {
  // Site A holds islands 0 and 1 of 4 (one worker each): --first-island 0 says its 2 tasks are a
  // part of the run; without it they would have to be the whole run.
  for (int t = 0; t < 2; ++t) {
    const Placement p = resolve_placement({.islands = 4, .first_island = 0}, slurm(t, 2));
    EXPECT_EQ(p.island, t);
    EXPECT_EQ(p.rank, 0);
    EXPECT_EQ(p.islands, 4);
  }
  EXPECT_THROW(resolve_placement({.islands = 4}, slurm(0, 2)), ConfigError);
  // One island's own job step: `srun --ntasks=1 atoll worker --islands 2 --first-island 1`.
  EXPECT_EQ(resolve_placement({.islands = 2, .first_island = 1}, slurm(0, 1)).island, 1);
}

TEST(Placement, MismatchesAreConfigErrors) {
  const std::vector<std::pair<std::pair<PlacementFlags, SchedulerEnv>, std::string>> cases = {
      {{{.islands = 4}, slurm(0, 6)}, "SLURM_NTASKS=6 tasks, but --islands 4 x --workers-per-island 1 = 4"},
      {{{.workers_per_island = 4}, slurm(0, 6)}, "not a multiple of --workers-per-island 4"},
      {{{}, read_scheduler_env(env_of({{"JOB_COMPLETION_INDEX", "0"}}))}, "--islands is required"},
      {{{.islands = 2}, read_scheduler_env(env_of({{"JOB_COMPLETION_INDEX", "2"}}))}, "JOB_COMPLETION_INDEX=2 is beyond"},
      {{{}, SchedulerEnv{}}, "no placement"},
      {{{.island = 0}, slurm(0, 1)}, "--island is given without --rank"},
      {{{.rank = 0}, SchedulerEnv{}}, "--rank is given without --island"},
      {{{.first_island = 2}, slurm(0, 2)}, "--first-island 2 needs --islands"},
      {{{.islands = 3, .first_island = 2}, slurm(0, 2)}, "not whole islands of --workers-per-island 1 from --first-island 2"},
      {{{.islands = 4, .workers_per_island = 2, .first_island = 1}, slurm(0, 3)}, "not whole islands"},
      {{{.islands = 2, .first_island = 0}, slurm(0, 3)}, "3 tasks, which are not whole islands of --workers-per-island 1 "
                                                         "from --first-island 0 below --islands 2"},
      {{{.islands = 4}, slurm(0, 2)}, "or pass --first-island K when this job holds only islands K.. of the run"},
      {{{.islands = 3, .first_island = 2}, read_scheduler_env(env_of({{"JOB_COMPLETION_INDEX", "1"}}))},
       "JOB_COMPLETION_INDEX=1 from --first-island 2 is beyond"},
  };
  for (const auto& [input, names] : cases) {
    SCOPED_TRACE(names);
    try {
      resolve_placement(input.first, input.second);
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("fix"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace atl
