// `atoll launch` (see launch.h for the steps, the files written and the exit statuses).
#include "atoll/supervise/launch.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/core/errors.h"
#include "atoll/core/timer.h"
#include "atoll/dist/fragments.h"
#include "atoll/dist/store.h"
#include "atoll/engine/memory_estimate.h"
#include "atoll/supervise/launcher.h"
#include "atoll/supervise/redis_server.h"
#include "atoll/train/dataset.h"
#include "atoll/train/island_trainer.h"
#include "atoll/train/metrics.h"
#include "atoll/train/progress.h"
#include "atoll/train/run_dir.h"
#include "atoll/train/state_checkpoint.h"
#include "atoll/train/trainer.h"

namespace atl {

namespace {

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
  LaunchView(int64_t steps, int64_t first_step, JsonlWriter* metrics)
      : progress_("step", steps, first_step), metrics_(metrics) {}

  void output(const std::string& name, const std::string& line) { progress_.note("[" + name + "] " + line); }
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

// The store the workers meet in: a private redis-server (kept in *redis) when none is given,
// else the given one, which must answer PING now. Returns its URL.
std::string open_store(const std::string& given, std::chrono::milliseconds timeout, std::unique_ptr<RedisServer>* redis) {
  if (given.empty()) {
    *redis = std::make_unique<RedisServer>(RedisServerOptions{.start_timeout = timeout});
    return (*redis)->url();
  }
  const StoreAddress a = parse_store_url(given);
  std::string why;
  if (!redis_ping(a.host, a.port, std::min(timeout, std::chrono::milliseconds(10000)), &why))
    throw Timeout("--store " + a.url() + " does not answer (" + why +
                  "); fix: start redis-server there, or leave out --store to start one on loopback");
  return a.url();
}

// The command line of worker (island, rank).
std::vector<std::string> worker_argv(const LaunchOptions& o, const RunDir& rd, const std::string& store,
                                     const std::string& run_id, int threads, int island, int rank) {
  std::vector<std::string> argv = {self_executable(), "worker", "--store", store, "--island", std::to_string(island),
                                   "--rank", std::to_string(rank), "--islands", std::to_string(o.islands),
                                   "--workers-per-island", std::to_string(o.workers_per_island), "--config",
                                   rd.path + "/config.toml", "--set", "train.threads=" + std::to_string(threads),
                                   "--run-dir", rd.path, "--run-id", run_id, "--metrics-fd", "3", "--quiet"};
  if (!rd.checkpoint.empty()) argv.insert(argv.end(), {"--resume-from", rd.checkpoint});
  return argv;
}

// The launcher's error line for a failed worker: its own error message, without its prefix.
[[noreturn]] void throw_worker_failed(const std::string& name, const ChildExit& e) {
  std::string why = e.last_error.empty() ? "no error message" : e.last_error.substr(e.last_error.find(':') + 1);
  while (!why.empty() && why.front() == ' ') why.erase(0, 1);
  if (why.rfind("error: ", 0) == 0) why.erase(0, 7);
  if (why.find("fix") == std::string::npos) why += "; fix: see the worker's output above";
  throw Error(name + " failed (" + e.describe() + "), every worker stopped: " + why);
}

}  // namespace

int launch(const LaunchOptions& o) {
  const Config& cfg = o.config;
  validate_streaming(cfg.diloco, cfg.model.n_layers);
  const int N = o.islands, M = o.workers_per_island, W = N * M;
  check_memory_fits(cfg, {.processes = W});  // every worker on this machine, before the data is prepared
  if (o.resume && o.run_dir.empty()) throw ConfigError("--resume needs --run-dir; fix: pass the run directory to continue");
  const std::string run_dir = o.run_dir.empty() ? default_run_dir() : o.run_dir;
  if (o.print_config)
    std::printf("# resolved config (%s)\n%s\n", o.config_path.empty() ? "built-in defaults" : o.config_path.c_str(),
                config_to_toml(cfg).c_str());
  else
    std::printf("%s; %d islands x %d workers\n", describe_run(cfg, run_dir).c_str(), N, M);
  std::fflush(stdout);
  const double t_start = now_s();
  // Held until launch returns: the workers it starts write the folder under this lock.
  RunDir rd = open_run_dir(run_dir, cfg, {.resume = o.resume, .allow_config_change = o.allow_config_change});
  const DatasetInfo data = resolve_dataset(cfg);  // prepared once here, so the workers find it ready
  int64_t resume_step = 0;
  if (!rd.checkpoint.empty()) {  // refused here, before any worker starts, if it cannot resume
    const nlohmann::json manifest = read_training_manifest(rd.checkpoint);
    check_resume(manifest, rd.checkpoint, cfg, N, M, /*diloco=*/true);
    resume_step = manifest.at("step").get<int64_t>();
  }
  std::unique_ptr<RedisServer> redis;
  const std::string store = open_store(o.store, std::chrono::milliseconds(int64_t(cfg.fault.timeout_s * 1000)), &redis);
  begin_run(rd, cfg);
  if (!data.tokenizer_path.empty())  // so `atoll generate` and `atoll export` find it, as for `atoll train`
    std::filesystem::copy_file(data.tokenizer_path, rd.path + "/tokenizer.model",
                               std::filesystem::copy_options::overwrite_existing);
  // Rows after the checkpoint are logged again by the resumed run.
  if (rd.resumed) truncate_jsonl_after_step(rd.path + "/metrics.jsonl", resume_step);
  JsonlWriter events(rd.path + "/events.jsonl");
  JsonlWriter metrics(rd.path + "/metrics.jsonl");
  events.write({{"event", "launch"}, {"islands", N}, {"workers_per_island", M}, {"store", store}});
  record_resume(events, rd, resume_step);

  // Cores shared out when train.threads = 0 (all cores), so W workers do not oversubscribe.
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = cfg.train.threads > 0 ? cfg.train.threads : std::max(1, cores / W);
  const std::string run_id = make_run_id();
  LaunchView view(cfg.train.steps, resume_step, &metrics);
  std::vector<std::string> names;
  Supervisor sup({.stop_grace = o.stop_grace,
                  .on_output = [&](int c, const std::string& line) { view.output(names[size_t(c)], line); },
                  .on_metrics = [&](int c, const std::string& line) { view.row(c, line); }});
  for (int i = 0; i < N; ++i)
    for (int r = 0; r < M; ++r) {
      names.push_back("island " + std::to_string(i) + " rank " + std::to_string(r));
      sup.spawn({.name = names.back(),
                 .argv = worker_argv(o, rd, store, run_id, threads, i, r),
                 .env = {"OMP_WAIT_POLICY=passive"}});
    }
  const SupervisorOutcome out = sup.run();
  view.finish();
  if (redis) redis->stop();
  const std::string latest = latest_checkpoint(rd.path);
  if (out.interrupted) {
    events.write({{"event", "interrupted"}, {"signal", out.signal}, {"checkpoint", latest}});
    std::fprintf(stderr, "atoll: interrupted (signal %d): every worker stopped; last complete checkpoint: %s\n", out.signal,
                 latest.empty() ? "none" : latest.c_str());
    return 128 + out.signal;
  }
  if (out.failed >= 0) {
    const ChildExit& e = out.children[size_t(out.failed)];
    events.write({{"event", "worker_failed"}, {"worker", names[size_t(out.failed)]}, {"status", e.describe()},
                  {"error", e.last_error}});
    throw_worker_failed(names[size_t(out.failed)], e);
  }
  events.write({{"event", "end"}, {"step", cfg.train.steps}});
  char summary[512];
  std::snprintf(summary, sizeof summary,
                "run %s: %d islands x %d workers, %ld steps, %ld outer steps (%ld with differing theta_hash) in %.1f s\n"
                "final checkpoint %s\n",
                rd.path.c_str(), N, M, long(cfg.train.steps), long(view.outer_steps()), long(view.split_hashes()),
                now_s() - t_start, latest.c_str());
  std::printf("\n%s", summary);
  std::ofstream(rd.path + "/summary.txt") << summary;
  return view.split_hashes() == 0 ? 0 : 3;
}

}  // namespace atl
