// atoll under a real Slurm (issue 38): each test starts a one-host cluster of Debian's slurm-wlm
// (tests/slurm/one_host_slurm.sh: munged, slurmctld, slurmd in a network namespace of their own)
// and drives it with sbatch, srun and scancel:
//   - the sbatch script of docs/cluster.md, taken from the page as written (only the resources
//     this one host has given on sbatch's command line), trains 2 islands x 2 workers to the end:
//     the job COMPLETED, a checkpoint and metrics.jsonl in its run folder, one θ;
//   - the same script preempted (SIGTERM to its tasks): exit 79, the script requeues the job, it
//     resumes from the stop's checkpoint and trains to the end;
//   - a 2-task `srun` of islands, placed by Slurm's variables, trains (the loss falls);
//   - `scancel JOBID.STEPID` of one island's job step mid-run: the run survives (below);
//   - an allocation whose task count is not --islands x --workers-per-island: every task exits
//     78 with the one clear line, and nothing is written.
// Needs root (network namespaces, SlurmUser=root) and the Debian packages: skipped otherwise.
// Every wait is bounded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

constexpr int kConfigExit = 78;  // train/island_trainer.h, documented in docs/cluster.md

std::string source_dir() {
  const char* src = std::getenv("ATOLL_SOURCE_DIR");
  return fs::absolute(src && *src ? src : ".").string();  // commands run from the test's folder
}
std::string cluster_script() { return source_dir() + "/tests/slurm/one_host_slurm.sh"; }

// `s` as one single-quoted shell word.
std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Asks `done()` every 200 ms for up to `timeout_s`; false when the time ran out first.
template <typename F>
bool within(double timeout_s, F&& done) {
  for (int i = 0; i < int(timeout_s * 5); ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return done();
}

struct Shell {
  int code = -1;  // 124: timed out
  std::string out;
};

class RealSlurm : public CliTest {
 protected:
  void SetUp() override {
    if (::getuid() != 0) GTEST_SKIP() << "needs root (network namespaces; the cluster runs as SlurmUser=root)";
    if (std::system("{ command -v slurmctld && command -v slurmd && command -v munged && command -v sbatch && "
                    "command -v nsenter && command -v ip && command -v redis-server; } >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "needs Debian's slurm-wlm, munge, redis-server and iproute2";
    CliTest::SetUp();
    cluster_ = dir("slurm");
    const std::string log = dir("cluster-up.log");
    up_ = true;
    ASSERT_EQ(std::system(("timeout 90 " + cluster_script() + " up " + cluster_ + " >" + log + " 2>&1").c_str()), 0)
        << read_file(log);
  }
  void TearDown() override {  // the daemons, the jobs' processes and the store: all in the cluster's namespace
    if (up_) std::system(("timeout 60 " + cluster_script() + " down " + cluster_ + " >/dev/null 2>&1").c_str());
  }

  // The environment every command in the cluster gets: the tests' (a private cache folder) and
  // `atoll` on the PATH, as a job script expects it.
  std::string env_words() const {
    std::string words = "PATH=" + quoted(fs::path(atoll_bin()).parent_path().string() + ":/usr/sbin:/usr/bin:/sbin:/bin");
    for (const std::string& kv : child_env())
      if (kv.find('=') != std::string::npos) words += " " + quoted(kv);
    return words;
  }
  // `command` (a bash line) inside the cluster's namespace, from this test's folder, at most
  // `timeout_s`; its stdout and stderr together.
  Shell in_cluster(const std::string& command, double timeout_s = 60) const {
    const std::string log = dir("shell.log");
    const std::string line = "cd " + quoted(dir()) + " && timeout " + std::to_string(int(timeout_s)) + " " +
                             cluster_script() + " run " + cluster_ + " env " + env_words() + " bash -c " +
                             quoted(command) + " >" + log + " 2>&1";
    const int status = std::system(line.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(log)};
  }
  // A redis-server on port 6379 of the cluster's loopback (where an srun task finds it: the first
  // host of SLURM_JOB_NODELIST), in the background until the cluster goes down; waits until it
  // accepts connections.
  void start_store() {
    const Shell s = in_cluster("redis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no --daemonize yes "
                               "--logfile " + quoted(dir("store.log")));
    ASSERT_EQ(s.code, 0) << s.out;
    ASSERT_TRUE(within(20, [&] { return read_file(dir("store.log")).find("Ready to accept") != std::string::npos; }))
        << read_file(dir("store.log"));
  }
  // The micro config with outer steps every 2 inner steps, trained for `steps`.
  std::string config(int steps = 4) const {
    const std::string path = dir("micro-" + std::to_string(steps) + ".toml");
    std::string text = world().config_text();
    text.replace(text.find("\nsteps = 4\n"), 11, "\nsteps = " + std::to_string(steps) + "\n");
    if (!fs::exists(path)) std::ofstream(path) << text << "\n[diloco]\ninner_steps = 2\n";
    return path;
  }
  // Submits `script` (in this test's folder) with sbatch's `options`; the job id.
  std::string submit(const std::string& options, const std::string& script) const {
    const Shell s = in_cluster("sbatch --parsable " + options + " " + script);
    if (s.code != 0) throw std::runtime_error("sbatch failed: " + s.out);
    return s.out.substr(0, s.out.find_first_of(";\n"));
  }

  // The job's state once it left the queue (within `timeout_s`): "JobState=... ExitCode=...".
  std::string finished_job(const std::string& id, double timeout_s) const {
    const bool left = within(timeout_s, [&] {
      const Shell q = in_cluster("squeue -h -j " + id + " -o %T");
      return q.code == 0 && q.out.find_first_not_of(" \n") == std::string::npos;
    });
    if (!left) return "still queued or running after " + std::to_string(int(timeout_s)) + " s";
    return in_cluster("scontrol show job " + id).out;
  }

  // This test's files, but for the cluster's own (slurm/: its logs and state) and the record of
  // the last command (shell.log).
  std::map<std::string, std::string> test_files() const {
    std::map<std::string, std::string> files = snapshot(dir());
    std::erase_if(files, [](const auto& f) { return f.first.starts_with("slurm/") || f.first == "shell.log"; });
    return files;
  }

  std::string cluster_;
  bool up_ = false;
};

// "theta X" of each worker's final line ("island I rank R: ... theta X").
std::vector<std::string> final_thetas(const std::string& out) {
  std::vector<std::string> thetas;
  static const std::regex line(R"(island \d+ rank \d+: \d+ steps, .*theta ([0-9a-f]+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) thetas.push_back((*it)[1]);
  return thetas;
}

// The theta hashes of a run's last outer step in its metrics.jsonl (one per worker that logged it).
std::set<std::string> last_theta_hashes(const std::string& run) {
  std::map<int64_t, std::set<std::string>> by_step;
  for (const auto& row : read_jsonl(run + "/metrics.jsonl"))
    if (row.contains("theta_hash")) by_step[row["step"].get<int64_t>()].insert(row["theta_hash"].get<std::string>());
  return by_step.empty() ? std::set<std::string>{} : by_step.rbegin()->second;
}

// The sbatch script of docs/cluster.md ("Slurm: an sbatch script"): the page's first bash block
// with #SBATCH lines, byte for byte.
std::string docs_sbatch_script() {
  const std::string page = read_file(source_dir() + "/docs/cluster.md");
  const size_t at = page.find("```bash\n#!/bin/bash\n#SBATCH");
  if (at == std::string::npos) return "";
  const size_t from = page.find('\n', at) + 1;
  const size_t to = page.find("\n```", from);
  return to == std::string::npos ? "" : page.substr(from, to - from + 1);
}

// sbatch's options win over the script's #SBATCH lines: one host of 8 CPUs instead of two nodes
// of 2 x 8 CPUs.
constexpr const char* kOneHost = "--nodes=1 --ntasks-per-node=4 --cpus-per-task=1";

TEST_F(RealSlurm, TheSbatchScriptOfTheDocsTrainsToACheckpoint) {
  const std::string script = docs_sbatch_script();
  ASSERT_FALSE(script.empty()) << "docs/cluster.md has no ```bash block starting #!/bin/bash and #SBATCH";
  std::ofstream(dir("atoll.sbatch")) << script;
  base_run();  // the micro world's data, prepared before the four workers read it
  // The config through ATOLL_CONFIG, which the script reads.
  const std::string id =
      submit("--export=ALL,ATOLL_CONFIG=" + quoted(config()) + " " + kOneHost + " --output=job.out", "atoll.sbatch");
  const std::string job = finished_job(id, 120);
  const std::string out = read_file(dir("job.out"));
  EXPECT_NE(job.find("JobState=COMPLETED"), std::string::npos) << job << out;
  EXPECT_NE(job.find("ExitCode=0:0"), std::string::npos) << job << out;
  // Slurm placed the four tasks: island 0 ranks 0-1, island 1 ranks 0-1, run id slurm-<job id>.
  for (int t = 0; t < 4; ++t) {
    const std::string placed = "placement: island " + std::to_string(t / 2) + " rank " + std::to_string(t % 2) +
                               " of 2 island(s) x 2 worker(s) (slurm SLURM_PROCID=" + std::to_string(t) +
                               " of SLURM_NTASKS=4, local task " + std::to_string(t) +
                               " on localhost, hosts localhost); store redis://localhost:6379, run id slurm-" + id;
    EXPECT_NE(out.find(placed), std::string::npos) << placed << "\n" << out;
  }
  const std::vector<std::string> thetas = final_thetas(out);
  EXPECT_EQ(thetas.size(), 4u) << out;
  EXPECT_EQ(std::set<std::string>(thetas.begin(), thetas.end()).size(), 1u) << "the workers end with different θ:\n"
                                                                              << out;
  const std::string run = dir("runs/atoll-" + id);
  const std::string latest = read_file(run + "/checkpoints/latest");
  ASSERT_FALSE(latest.empty()) << "no checkpoint in " << run << ":\n" << out;
  const std::string step = latest.substr(0, latest.find_last_not_of(" \n") + 1);
  EXPECT_TRUE(fs::exists(run + "/checkpoints/" + step + "/manifest.json")) << step;
  for (int r = 0; r < 4; ++r)  // every worker's part of the final checkpoint
    EXPECT_TRUE(fs::exists(run + "/checkpoints/" + step + "/rank-0000" + std::to_string(r) + ".safetensors")) << r;
  std::set<std::pair<int, int>> to_the_end;  // (island, rank) of the rows of step train.steps = 4
  for (const auto& row : read_jsonl(run + "/metrics.jsonl"))
    if (row.value("step", int64_t(0)) == 4 && row.contains("loss")) to_the_end.insert({row["island"].get<int>(), row["rank"].get<int>()});
  EXPECT_EQ(to_the_end.size(), 4u) << "metrics.jsonl lacks a worker's row of the last step:\n" << out;
}

// Preemption as the script of docs/cluster.md handles it: SIGTERM to the job's tasks (what Slurm
// sends at preemption, at the time limit with --signal=TERM@120, or `scancel --signal=TERM`)
// stops every worker at one agreed step with that step's checkpoint (`preempted`), srun returns
// 79, the script requeues the job; it comes back with the same job id and run folder (Slurm
// starts a requeued job once its credentials expired: 11 s here, one_host_slurm.sh), resumes
// from that checkpoint (`resume` at the same step) and trains to the end: the job COMPLETED
// after one restart, with the θ of the same run uninterrupted (`atoll launch`, 2 x 2 workers).
TEST_F(RealSlurm, TheSbatchScriptRequeuesAPreemptedJobThatResumesToTheEnd) {
  const std::string script = docs_sbatch_script();
  ASSERT_FALSE(script.empty());
  std::ofstream(dir("atoll.sbatch")) << script;
  base_run();
  const std::string id = submit("--export=ALL,ATOLL_CONFIG=" + quoted(config(100)) + " " + kOneHost +
                                    " --open-mode=append --output=job.out",
                                "atoll.sbatch");
  const std::string run = dir("runs/atoll-" + id);
  auto newest_step = [&] {
    int64_t step = 0;
    for (const auto& row : read_jsonl_whole_lines(run + "/metrics.jsonl"))
      step = std::max(step, row.value("step", int64_t(0)));
    return step;
  };
  ASSERT_TRUE(within(60, [&] { return newest_step() >= 10; })) << read_file(dir("job.out"));
  const Shell term = in_cluster("scancel --signal=TERM " + id);
  ASSERT_EQ(term.code, 0) << term.out;
  // The same run uninterrupted, on this machine while Slurm holds the requeued job.
  Background whole({"launch", "--islands", "2", "--workers-per-island", "2", "--config", config(100), "--set",
                    "train.threads=1", "--run-dir", dir("uninterrupted")},
                   dir("uninterrupted"));
  const std::string job = finished_job(id, 120);
  const std::string out = read_file(dir("job.out"));
  EXPECT_NE(job.find("JobState=COMPLETED"), std::string::npos) << job << out;
  EXPECT_NE(job.find("Restarts=1 "), std::string::npos) << job << out;
  std::vector<nlohmann::json> stops, resumes, ends;
  for (const auto& row : read_jsonl(run + "/events.jsonl")) {
    const std::string event = row.value("event", "");
    if (event == "preempted") stops.push_back(row);
    if (event == "resume") resumes.push_back(row);
    if (event == "end") ends.push_back(row);
  }
  ASSERT_EQ(stops.size(), 1u) << read_file(run + "/events.jsonl") << out;
  ASSERT_EQ(resumes.size(), 1u) << read_file(run + "/events.jsonl") << out;
  ASSERT_EQ(ends.size(), 1u) << read_file(run + "/events.jsonl") << out;
  const int64_t stopped_at = stops[0]["step"].get<int64_t>();
  EXPECT_GT(stopped_at, 0);
  EXPECT_LT(stopped_at, 100) << "the run ended before the signal: nothing was preempted";
  EXPECT_EQ(resumes[0]["step"].get<int64_t>(), stopped_at) << "resumed elsewhere than the preempted step's checkpoint";
  EXPECT_EQ(ends[0]["step"].get<int64_t>(), 100);
  EXPECT_EQ(read_file(run + "/checkpoints/latest"), "step-00000100\n");
  // Every worker said so: four stopped by the signal (exit 79) the first time, four to the end after.
  size_t stopped = 0, finished = 0;
  for (const std::string& line : split_lines(out)) {
    stopped += line.find(": stopped by a signal after ") != std::string::npos;
    finished += line.find(": 100 steps, ") != std::string::npos;
  }
  EXPECT_EQ(stopped, 4u) << out;
  EXPECT_EQ(finished, 4u) << out;
  const int whole_status = whole.wait();
  ASSERT_TRUE(WIFEXITED(whole_status) && WEXITSTATUS(whole_status) == 0) << read_file(dir("uninterrupted.err"));
  const std::set<std::string> preempted = last_theta_hashes(run), uninterrupted = last_theta_hashes(dir("uninterrupted"));
  EXPECT_EQ(preempted.size(), 1u) << out;
  EXPECT_EQ(preempted, uninterrupted) << "the preempted and requeued run ends elsewhere than the same run uninterrupted";
}

TEST_F(RealSlurm, AMultiTaskSrunOfIslandsTrains) {
  base_run();
  start_store();
  // No placement flags: each task takes its island from SLURM_PROCID and the store from the
  // first host of SLURM_JOB_NODELIST.
  const Shell run = in_cluster("srun --ntasks=2 --kill-on-bad-exit=0 atoll worker --config " + quoted(config()) +
                                   " --run-dir run --set train.steps=30 --set diloco.inner_steps=5 "
                                   "--set train.eval_every=0 --set checkpoint.every=0",
                               150);
  ASSERT_EQ(run.code, 0) << run.out;
  for (int t = 0; t < 2; ++t)
    EXPECT_NE(run.out.find("placement: island " + std::to_string(t) + " rank 0 of 2 island(s) x 1 worker(s) (slurm "
                           "SLURM_PROCID=" + std::to_string(t) + " of SLURM_NTASKS=2"),
              std::string::npos)
        << run.out;
  // Each island: 30 steps in 6 outer steps, its loss lower at the end, and one θ for both.
  static const std::regex line(R"(island (\d) rank 0: 30 steps, 6 outer steps, loss ([0-9.]+) -> ([0-9.]+), theta)");
  int islands = 0;
  for (std::sregex_iterator it(run.out.begin(), run.out.end(), line), end; it != end; ++it, ++islands)
    EXPECT_LT(std::stod((*it)[3]), std::stod((*it)[2]) - 0.1) << "island " << (*it)[1] << " did not train: " << run.out;
  EXPECT_EQ(islands, 2) << run.out;
  const std::vector<std::string> thetas = final_thetas(run.out);
  ASSERT_EQ(thetas.size(), 2u) << run.out;
  EXPECT_EQ(thetas[0], thetas[1]) << run.out;
}

// Each island its own one-task job step of one allocation (`srun --exact` in the batch script),
// placed by Slurm's variables from --first-island I of --islands 2 (a step holds a part of the
// run, as a site does: docs/cluster.md). `scancel JOBID.STEPID` of island 1's step: Slurm kills
// the step's task (SIGKILL: srun reports "Killed", status 137), a lost task; not SIGTERM, which
// stops every worker of the run at one agreed step (preemption). The
// run survives: island 0 drops island 1 (its `abort_retry` event names island 1 lost), commits
// outer steps past island 1's last (at least 3), trains to train.steps and exits 0, and the job
// completes; island 1's step ends with status 137.
TEST_F(RealSlurm, ScancelOfOneIslandsStepLeavesTheOtherTraining) {
  base_run();
  start_store();
  std::string batch = "#!/bin/bash\n";
  for (int i = 0; i < 2; ++i)
    batch += "( srun --ntasks=1 --exact --job-name=island" + std::to_string(i) + " --output=island" +
             std::to_string(i) + ".log atoll worker --islands 2 --first-island " + std::to_string(i) +
             " --config " + quoted(config()) + " --run-dir run" + std::to_string(i) +
             " --set train.steps=300 --set diloco.inner_steps=5 --set train.eval_every=0 --set checkpoint.every=0"
             " --set fault.heartbeat_s=0.2 --set fault.heartbeat_ttl_s=1 --set fault.timeout_s=3;"
             " echo $? >island" + std::to_string(i) + ".rc ) &\n";
  batch += "wait\n";
  std::ofstream(dir("islands.sbatch")) << batch;
  const std::string id = submit("--ntasks=2 --cpus-per-task=1 --output=job.out", "islands.sbatch");

  auto outer_steps = [&](int i) {
    std::set<int64_t> steps;
    for (const auto& row : read_jsonl_whole_lines(dir("run" + std::to_string(i)) + "/metrics.jsonl"))
      if (row.contains("outer_step") && row.contains("theta_hash")) steps.insert(row["outer_step"].get<int64_t>());
    return steps;
  };
  ASSERT_TRUE(within(60, [&] { return outer_steps(1).size() >= 2; }))
      << "island 1 logged no outer steps:\n" << read_file(dir("island1.log")) << read_file(dir("job.out"));
  // Island 1's step id, by its name.
  const Shell steps = in_cluster("squeue -h -s -j " + id + " -o '%i %j'");
  static const std::regex island1(R"((\d+\.\d+) island1)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(steps.out, m, island1)) << steps.out;
  const Shell cancel = in_cluster("scancel " + m[1].str());
  ASSERT_EQ(cancel.code, 0) << cancel.out;

  const std::string job = finished_job(id, 150);
  const std::string log0 = read_file(dir("island0.log")), log1 = read_file(dir("island1.log"));
  EXPECT_NE(job.find("JobState=COMPLETED"), std::string::npos) << job;
  EXPECT_EQ(read_file(dir("island0.rc")), "0\n") << log0;
  EXPECT_EQ(read_file(dir("island1.rc")), "137\n") << "island 1's step did not end by the cancel's SIGKILL:\n" << log1;
  bool dropped = false;
  for (const auto& row : read_jsonl(dir("run0/events.jsonl")))
    dropped = dropped || (row.value("event", "") == "abort_retry" && row.contains("lost") &&
                          row["lost"] == nlohmann::json::array({1}));
  EXPECT_TRUE(dropped) << "island 0 logged no abort_retry with island 1 lost:\n" << read_file(dir("run0/events.jsonl"));
  EXPECT_NE(log0.find("island 0 rank 0: 300 steps"), std::string::npos) << log0;
  for (int i = 0; i < 2; ++i)
    EXPECT_NE(read_file(dir("island" + std::to_string(i) + ".log"))
                  .find("placement: island " + std::to_string(i) + " rank 0 of 2 island(s) x 1 worker(s) (slurm "
                        "SLURM_PROCID=0 of SLURM_NTASKS=1, local task "),
              std::string::npos)
        << read_file(dir("island" + std::to_string(i) + ".log"));
  const std::set<int64_t> by0 = outer_steps(0), by1 = outer_steps(1);
  ASSERT_FALSE(by1.empty());
  int64_t without_island1 = 0;
  for (int64_t s : by0) without_island1 += s > *by1.rbegin();
  EXPECT_GE(without_island1, 3) << "island 0 committed few outer steps after island 1's last (" << *by1.rbegin()
                                << "):\n" << log0;
}

TEST_F(RealSlurm, ATaskCountThatIsNotIslandsTimesWorkersExits78AndWritesNothing) {
  const auto before = test_files();
  const Shell run = in_cluster("srun --ntasks=3 --kill-on-bad-exit=0 atoll worker --islands 2 --config " +
                                   quoted(world().config()) + " --run-dir run",
                               60);
  EXPECT_EQ(run.code, kConfigExit) << run.out;
  const std::string error =
      "atoll: error: the slurm job has SLURM_NTASKS=3 tasks, but --islands 2 x --workers-per-island 1 = 2; fix: "
      "start 2 tasks (one per worker), or change --islands/--workers-per-island to match, or pass --first-island K "
      "when this job holds only islands K.. of the run (one site of several)";
  size_t tasks = 0;
  for (size_t at = run.out.find(error); at != std::string::npos; at = run.out.find(error, at + 1)) ++tasks;
  EXPECT_EQ(tasks, 3u) << "every task says why:\n" << run.out;
  EXPECT_FALSE(fs::exists(dir("run"))) << "a run folder was made";
  EXPECT_TRUE(unchanged(before, test_files()));
}

}  // namespace
}  // namespace atl::testing
