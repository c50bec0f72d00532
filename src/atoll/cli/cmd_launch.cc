// `atoll launch` (the local supervisor of a multi-island run) and `atoll worker` (one process
// of it, on any host). DESIGN.md "Command line"; docs/islands.md.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/cli/commands.h"
#include "atoll/core/errors.h"
#include "atoll/core/timer.h"
#include "atoll/dist/fragments.h"
#include "atoll/dist/store.h"
#include "atoll/supervise/launcher.h"
#include "atoll/supervise/redis_server.h"
#include "atoll/train/dataset.h"
#include "atoll/train/island_trainer.h"
#include "atoll/train/metrics.h"
#include "atoll/train/progress.h"
#include "atoll/train/run_dir.h"

namespace atl::cli {

Runner add_worker(CLI::App& app) {
  auto* cmd = app.add_subcommand("worker", "one worker process of a multi-island run (started by `atoll launch`, or by hand on any host)");
  auto f = std::make_shared<WorkerOptions>();
  auto config = std::make_shared<ConfigFlags>();
  config->add_to(cmd, "default: configs/default.toml");
  cmd->add_option("--store", f->store_url, "rendezvous store, redis://HOST:PORT")->required();
  cmd->add_option("--island", f->island, "this worker's island, 0..N-1")->required()->check(CLI::NonNegativeNumber);
  cmd->add_option("--rank", f->rank, "this worker's rank inside its island, 0..M-1")->required()->check(CLI::NonNegativeNumber);
  cmd->add_option("--islands", f->islands, "N: islands in the run")->required()->check(CLI::PositiveNumber);
  cmd->add_option("--workers-per-island", f->workers_per_island, "M: workers per island")->check(CLI::PositiveNumber);
  cmd->add_option("--run-id", f->run_id, "store key prefix shared by every worker of the run, unique per run");
  cmd->add_option("--run-dir", f->run_dir, "run directory (island 0 rank 0 writes checkpoints there)");
  cmd->add_option("--metrics-fd", f->metrics_fd, "write metrics rows to this file descriptor (used by `atoll launch`)");
  cmd->add_flag("--quiet", f->quiet, "no log lines");
  cmd->add_option("--resume-from", f->resume_from, "continue from this checkpoint of the run (used by `atoll launch --resume`)");
  return [cmd, f, config]() -> int {
    if (!cmd->parsed()) return -1;
    if (f->island >= f->islands)
      throw ConfigError("--island " + std::to_string(f->island) + " is not below --islands " + std::to_string(f->islands) +
                        "; fix: islands are numbered 0..N-1");
    if (f->rank >= f->workers_per_island)
      throw ConfigError("--rank " + std::to_string(f->rank) + " is not below --workers-per-island " +
                        std::to_string(f->workers_per_island) + "; fix: ranks are numbered 0..M-1");
    if (config->path.empty()) config->path = default_config_path();
    const WorkerResult r = run_worker(config->load(), *f);
    if (!f->quiet)
      std::printf("island %d rank %d: %ld steps, %ld outer steps, loss %.4f -> %.4f, theta %s\n", f->island, f->rank,
                  long(r.steps), long(r.outer_steps), r.first_loss, r.final_loss, r.theta_hash.c_str());
    return 0;
  };
}

namespace {

struct LaunchFlags {
  ConfigFlags config;
  int islands = 1;
  int workers_per_island = 1;
  std::string store;
  std::string run_dir;
  double stop_grace_s = 5.0;
  bool resume = false;
};

// A unique store prefix for this run: the store may be shared with other runs.
std::string make_run_id() {
  char buf[64];
  std::snprintf(buf, sizeof buf, "run-%ld-%d", long(std::chrono::system_clock::now().time_since_epoch().count()),
                int(::getpid()));
  return buf;
}

// The merged view: worker 0's rows drive one progress line, with every island's latest loss;
// other workers' output lines are shown with their name in front.
class LaunchView {
 public:
  LaunchView(int64_t steps, JsonlWriter* metrics) : progress_("step", steps), metrics_(metrics) {}

  void output(const std::string& name, const std::string& line) {
    progress_.note("[" + name + "] " + line);
  }
  void row(int child, const std::string& line) {
    nlohmann::json r;
    try {
      r = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      output("worker " + std::to_string(child), "(not a metrics row) " + line);
      return;
    }
    metrics_->write(r);  // whole lines, one writer: never interleaved
    const int island = r.value("island", 0);
    if (r.contains("loss")) loss_[island] = r["loss"].get<double>();
    if (r.contains("theta_hash")) hashes_[r["outer_step"].get<int64_t>()].insert(r["theta_hash"].get<std::string>());
    if (child != 0) return;
    std::string fields;
    char buf[64];
    for (const auto& [i, l] : loss_) std::snprintf(buf, sizeof buf, "%si%d %.3f", fields.empty() ? "loss " : " ", i, l), fields += buf;
    if (r.contains("outer_step")) outer_ = r["outer_step"].get<int64_t>();
    std::snprintf(buf, sizeof buf, " | outer %ld | %.1f MB sent", long(outer_), r.value("comm_bytes", 0.0) / 1e6);
    progress_.update(r.value("step", int64_t(0)), fields + buf);
  }
  void finish() { progress_.finish(); }
  // Outer steps whose θ hashes differ between workers.
  int64_t split_hashes() const {
    int64_t n = 0;
    for (const auto& [s, h] : hashes_) n += h.size() > 1;
    return n;
  }
  int64_t outer_steps() const { return int64_t(hashes_.size()); }

 private:
  Progress progress_;
  JsonlWriter* metrics_;
  std::map<int, double> loss_;
  std::map<int64_t, std::set<std::string>> hashes_;
  int64_t outer_ = 0;
};

}  // namespace

Runner add_launch(CLI::App& app) {
  auto* cmd = app.add_subcommand("launch", "run N islands (x M workers) on this machine: DiLoCo across islands");
  auto f = std::make_shared<LaunchFlags>();
  f->config.add_to(cmd, "default: configs/default.toml");
  cmd->add_option("--islands", f->islands, "N: islands (DiLoCo across them)")->required()->check(CLI::Range(1, 256));
  cmd->add_option("--workers-per-island", f->workers_per_island, "M: workers per island (data parallel inside it)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--store", f->store, "use this Redis store, redis://HOST:PORT (default: start redis-server on loopback)");
  cmd->add_option("--run-dir", f->run_dir, "run directory (default: runs/<date-time>)");
  cmd->add_option("--stop-grace", f->stop_grace_s, "seconds a stopped worker gets before SIGKILL")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--resume", f->resume, "continue the run in --run-dir from its newest checkpoint (same --islands and --workers-per-island)");
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    if (f->config.path.empty()) f->config.path = default_config_path();
    const Config cfg = f->config.load();
    validate_streaming(cfg.diloco, cfg.model.n_layers);
    const int N = f->islands, M = f->workers_per_island, W = N * M;
    std::printf("# resolved config (%s)\n%s\n", f->config.path.empty() ? "built-in defaults" : f->config.path.c_str(),
                config_to_toml(cfg).c_str());
    const double t_start = now_s();
    resolve_dataset(cfg);  // prepared once here, so the workers find it ready
    if (f->resume && f->run_dir.empty())
      throw ConfigError("--resume needs --run-dir; fix: pass the run directory to continue");
    RunDir rd = inspect_run_dir(f->run_dir.empty() ? default_run_dir() : f->run_dir, cfg, f->resume);
    int64_t resume_step = 0;
    if (!rd.checkpoint.empty()) {  // refused here, before any worker starts, if it cannot resume
      const nlohmann::json state = read_checkpoint_manifest(rd.checkpoint).at("state");
      check_resume(state, rd.checkpoint, cfg, N, M);
      resume_step = state.at("step").get<int64_t>();
    }
    const auto timeout = std::chrono::milliseconds(int64_t(cfg.fault.timeout_s * 1000));
    std::unique_ptr<RedisServer> redis;
    std::string store = f->store;
    if (store.empty()) {
      redis = std::make_unique<RedisServer>(RedisServerOptions{.start_timeout = timeout});
      store = redis->url();
    } else {
      const StoreAddress a = parse_store_url(store);
      std::string why;
      if (!redis_ping(a.host, a.port, std::min(timeout, std::chrono::milliseconds(10000)), &why))
        throw Timeout("--store " + a.url() + " does not answer (" + why +
                      "); fix: start redis-server there, or leave out --store to start one on loopback");
      store = a.url();
    }
    write_run_config(rd, cfg);
    // Rows after the checkpoint are logged again by the resumed run.
    if (!rd.checkpoint.empty()) truncate_jsonl_after_step(rd.path + "/metrics.jsonl", resume_step);
    JsonlWriter events(rd.path + "/events.jsonl");
    JsonlWriter metrics(rd.path + "/metrics.jsonl");
    events.write({{"event", "launch"}, {"islands", N}, {"workers_per_island", M}, {"store", store}});
    if (!rd.checkpoint.empty()) events.write({{"event", "resume"}, {"step", resume_step}, {"checkpoint", rd.checkpoint}});

    // Cores shared out when train.threads = 0 (all cores), so W workers do not oversubscribe.
    const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    const int threads = cfg.train.threads > 0 ? cfg.train.threads : std::max(1, cores / W);
    const std::string run_id = make_run_id();
    LaunchView view(cfg.train.steps, &metrics);
    std::vector<std::string> names;
    Supervisor sup({.stop_grace = std::chrono::milliseconds(int64_t(f->stop_grace_s * 1000)),
                    .on_output = [&](int c, const std::string& line) { view.output(names[size_t(c)], line); },
                    .on_metrics = [&](int c, const std::string& line) { view.row(c, line); }});
    const std::string exe = self_executable();
    for (int i = 0; i < N; ++i)
      for (int r = 0; r < M; ++r) {
        names.push_back("island " + std::to_string(i) + " rank " + std::to_string(r));
        std::vector<std::string> argv = {exe, "worker", "--store", store, "--island", std::to_string(i), "--rank", std::to_string(r),
                            "--islands", std::to_string(N), "--workers-per-island", std::to_string(M), "--config",
                            rd.path + "/config.toml", "--set", "train.threads=" + std::to_string(threads),
                            "--run-dir", rd.path, "--run-id", run_id, "--metrics-fd", "3", "--quiet"};
        if (!rd.checkpoint.empty()) argv.insert(argv.end(), {"--resume-from", rd.checkpoint});
        sup.spawn({.name = names.back(), .argv = argv, .env = {"OMP_WAIT_POLICY=passive"}});
      }
    const SupervisorOutcome out = sup.run();
    view.finish();
    if (redis) redis->stop();
    const std::string latest = latest_checkpoint(rd.path);
    if (out.interrupted) {
      events.write({{"event", "interrupted"}, {"signal", out.signal}, {"checkpoint", latest}});
      std::fprintf(stderr, "atoll: interrupted (signal %d): every worker stopped; last complete checkpoint: %s\n",
                   out.signal, latest.empty() ? "none" : latest.c_str());
      return 128 + out.signal;
    }
    if (out.failed >= 0) {
      const ChildExit& e = out.children[size_t(out.failed)];
      events.write({{"event", "worker_failed"}, {"worker", names[size_t(out.failed)]}, {"status", e.describe()},
                    {"error", e.last_error}});
      std::string why = e.last_error.empty() ? "no error message" : e.last_error.substr(e.last_error.find(':') + 1);
      while (!why.empty() && why.front() == ' ') why.erase(0, 1);
      if (why.rfind("error: ", 0) == 0) why.erase(0, 7);
      if (why.find("fix") == std::string::npos) why += "; fix: see the worker's output above";
      throw Error(names[size_t(out.failed)] + " failed (" + e.describe() + "), every worker stopped: " + why);
    }
    events.write({{"event", "end"}, {"step", cfg.train.steps}});
    char summary[512];
    std::snprintf(summary, sizeof summary,
                  "run %s: %d islands x %d workers, %ld steps, %ld outer steps (%ld with differing theta_hash) in %.1f s\n"
                  "final checkpoint %s\n",
                  rd.path.c_str(), N, M, long(cfg.train.steps), long(view.outer_steps()), long(view.split_hashes()),
                  now_s() - t_start, latest.c_str());
    std::printf("\n%s", summary);
    return view.split_hashes() == 0 ? 0 : 3;
  };
}

}  // namespace atl::cli
