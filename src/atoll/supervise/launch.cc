// `atoll launch` (see launch.h for the steps, the files written and the exit statuses).
#include "atoll/supervise/launch.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
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
#include "atoll/dist/membership.h"
#include "atoll/dist/seal.h"
#include "atoll/dist/store.h"
#include "atoll/engine/memory_estimate.h"
#include "atoll/model/layout.h"
#include "atoll/supervise/launcher.h"
#include "atoll/supervise/live_view.h"
#include "atoll/supervise/redis_server.h"
#include "atoll/supervise/run_secrets.h"
#include "atoll/train/dataset.h"
#include "atoll/train/init_weights.h"
#include "atoll/train/island_trainer.h"
#include "atoll/train/metrics.h"
#include "atoll/train/metrics_log.h"
#include "atoll/train/report.h"
#include "atoll/train/progress.h"
#include "atoll/train/progress_mark.h"
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

// A worker's phase line on its metrics pipe (core/worker_phase.h), not a metrics row.
bool is_phase_line(const nlohmann::json& r) { return r.is_object() && r.size() == 1 && r.contains("phase"); }

// The merged view: worker 0's rows drive one progress line, with every island's latest loss;
// other workers' output lines are shown with their name in front.
class LaunchView {
 public:
  LaunchView(int64_t steps, int64_t first_step, MetricsLog* metrics)
      : progress_("step", steps, first_step), metrics_(metrics) {}

  void output(const std::string& name, const std::string& line) { progress_.note("[" + name + "] " + line); }
  // Writes a worker's row; returns it parsed (null when it is not JSON). A phase line is returned
  // as it is, and written nowhere.
  nlohmann::json row(int child, const std::string& line) {
    nlohmann::json r;
    try {
      r = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      output("worker " + std::to_string(child), "(not a metrics row) " + line);
      return nullptr;
    }
    if (is_phase_line(r)) return r;
    metrics_->write(r);  // whole lines, one writer: never interleaved
    const int island = r.value("island", 0);
    if (r.contains("loss")) loss_[island] = r["loss"].get<double>();
    if (r.contains("theta_hash")) hashes_[r["outer_step"].get<int64_t>()].insert(r["theta_hash"].get<std::string>());
    if (child != 0) return r;
    std::string fields;
    char buf[64];
    for (const auto& [i, l] : loss_) std::snprintf(buf, sizeof buf, "%si%d %.3f", fields.empty() ? "loss " : " ", i, l), fields += buf;
    if (r.contains("outer_step")) outer_ = r["outer_step"].get<int64_t>();
    std::snprintf(buf, sizeof buf, " | outer %ld | %.1f MB sent", long(outer_), r.value("comm_bytes", 0.0) / 1e6);
    progress_.update(r.value("step", int64_t(0)), fields + buf);
    return r;
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
  MetricsLog* metrics_;
  std::map<int, double> loss_;
  std::map<int64_t, std::set<std::string>> hashes_;
  int64_t outer_ = 0;
};

// The store the workers meet in: a private redis-server (kept in *redis) with a fresh password
// when none is given, else the given one (redis://[:PASSWORD@]HOST:PORT), which must answer PING
// now. Returns its address: the URL without the password, and the password apart.
StoreAddress open_store(const std::string& given, std::chrono::milliseconds timeout, std::unique_ptr<RedisServer>* redis) {
  if (given.empty()) {
    *redis = std::make_unique<RedisServer>(RedisServerOptions{.start_timeout = timeout, .password = random_secret()});
    StoreAddress a = parse_store_url((*redis)->url());
    a.password = (*redis)->password();
    return a;
  }
  const StoreAddress a = parse_store_url(given);
  std::string why;
  if (!redis_ping(a.host, a.port, std::min(timeout, std::chrono::milliseconds(10000)), &why, a.password))
    throw Timeout("--store " + a.url() + " does not answer (" + why +
                  "); fix: start redis-server there, or leave out --store to start one on loopback");
  return a;
}

// Our own store, restarted at once when it ends mid-run (killed, crashed): same port, same
// password; it comes back empty, so the launcher writes back the key it owns, the run token, and
// the workers write back theirs (dist/store.h "Restarts").
void keep_store_alive(RedisServer& redis, const StoreOptions& store, const std::string& run_token, JsonlWriter& events) {
  const std::string how = redis.restart_if_ended();
  if (how.empty()) return;
  events.write(event_row("store_restart", {{"store", redis.url()}, {"status", how}}));
  std::fprintf(stderr, "atoll: the store (redis-server on %s) ended (%s); started again on its port\n",
               redis.url().c_str(), how.c_str());
  Store s(store);
  publish_run_token(s, run_token);
}

// The command line of worker (island, rank); `join`: its restart, which rejoins the running run.
std::vector<std::string> worker_argv(const LaunchOptions& o, const RunDir& rd, const std::string& store,
                                     const std::string& run_id, int threads, int island, int rank, bool join) {
  std::vector<std::string> argv = {self_executable(), "worker", "--store", store, "--island", std::to_string(island),
                                   "--rank", std::to_string(rank), "--islands", std::to_string(o.islands),
                                   "--workers-per-island", std::to_string(o.workers_per_island), "--config",
                                   rd.path + "/config.toml", "--set", "train.threads=" + std::to_string(threads),
                                   "--run-dir", rd.path, "--run-id", run_id, "--metrics-fd", "3", "--quiet"};
  if (join) argv.push_back("--join");
  else if (!rd.checkpoint.empty()) argv.insert(argv.end(), {"--resume-from", rd.checkpoint});
  else if (!o.init_from.empty()) argv.insert(argv.end(), {"--init-from", std::filesystem::absolute(o.init_from).string()});
  return argv;
}

// A worker that finished (0), or stopped with the run at the step a signal set, its checkpoint
// written (kWorkerPreemptedExit).
bool stopped_cleanly(const ExitStatus& e) {
  return e.exited && e.signal == 0 && (e.exit_code == 0 || e.exit_code == kWorkerPreemptedExit);
}

// Elastic islands (docs/islands.md "Faults, membership and rejoin"): a worker that is lost after
// the run started (killed by a signal, or left with kWorkerRejoinExit: its island lost a worker,
// or the others re-formed without it) is restarted with --join after a backoff, while another
// island is whole to rejoin; any other bad end (an error that a restart would only repeat) fails
// the run as before. A worker makes progress when it logs a step beyond every step it logged
// before, or takes part in a committed outer step. fault.max_restarts caps the restarts of a
// worker in a row without progress (a crash loop), not over the run: a worker lost now and then
// over a weeks-long run, that rejoins and trains in between, is restarted every time. The
// backoff doubles with each restart without progress and starts again from
// fault.restart_backoff_s after progress: a crash loop backs off, while a worker lost now and
// then is not kept out for minutes (which could make it miss the run's end). Once a
// worker has finished (exit 0: the run is over), a worker that never logged the last step
// (stopped, or excluded) is stopped after the grace and ignored. Every incident goes to
// events.jsonl.
// The watchdog (fault.step_timeout_s > 0): a running worker whose progress file
// (train/progress_mark.h), touched since it (re)started, is older than the timeout is hung in a
// step; it is killed (SIGKILL) and restarted like any lost worker, `restart` saying `watchdog`.
class RestartPolicy {
 public:
  struct Worker {
    std::string name;
    int island = 0, rank = 0;
    std::vector<std::string> argv;  // for a restart: --join instead of --resume-from
    int restarts = 0;  // over the run, for the events
    int failing = 0;   // restarts in a row without progress: the cap's count and the backoff's exponent
    int64_t best_step = -1;  // the highest step it logged (any of its processes)
    bool last_step = false;  // logged a row of the last step
    double started_s = wall_s();  // when it was (re)started: older progress marks are its predecessor's
    bool watchdog = false;        // killed by the watchdog
  };

  RestartPolicy(const Config& cfg, JsonlWriter& events, std::chrono::milliseconds grace, std::vector<std::string> env,
                std::string run_dir)
      : fault_(cfg.fault), steps_(cfg.train.steps), events_(events), grace_(grace), env_(std::move(env)),
        run_dir_(std::move(run_dir)) {}
  void attach(Supervisor* sup) { sup_ = sup; }
  std::vector<Worker>& workers() { return workers_; }

  void row(int child, const nlohmann::json& r) {
    started_ = true;
    Worker& w = workers_[size_t(child)];
    const int64_t step = r.value("step", int64_t(0));
    if (step >= steps_) w.last_step = true;
    if (step > w.best_step || r.contains("theta_hash")) w.failing = 0;  // progress
    w.best_step = std::max(w.best_step, step);
  }

  ExitAction on_exit(int child, const ChildExit& e) {
    Worker& w = workers_[size_t(child)];
    if (stopped_cleanly(e)) {  // stopped with the run at the step a signal set
      if (!ended_) ended_ = now_s();
      return {.kind = ExitAction::Kind::kIgnore};
    }
    if (ended_) {
      std::fprintf(stderr, "atoll: %s ended (%s) after the run finished; ignored\n", w.name.c_str(), e.describe().c_str());
      return {.kind = ExitAction::Kind::kIgnore};
    }
    events_.write(event_row("peer_lost", {{"worker", w.name}, {"island", w.island}, {"rank", w.rank},
                                          {"status", e.describe()}, {"error", e.last_error}}));
    const bool rejoinable = e.signal != 0 || e.exit_code == kWorkerRejoinExit;
    const bool crash_loop = w.failing >= fault_.max_restarts;
    if (!rejoinable || !started_ || crash_loop || !another_island_whole(w.island)) {
      why_ = !rejoinable ? "" : !started_ ? " before the run started" : crash_loop
             ? " after " + std::to_string(w.failing) + " restart(s) in a row without a new step (fault.max_restarts = " +
               std::to_string(fault_.max_restarts) + ")"
             : ", with no whole island left to rejoin";
      return {.kind = ExitAction::Kind::kFail};
    }
    const double delay_s = std::min(kMaxBackoffS, fault_.restart_backoff_s * std::ldexp(1.0, w.failing));
    ++w.restarts, ++w.failing;
    events_.write(event_row("restart", {{"worker", w.name}, {"island", w.island}, {"rank", w.rank},
                                        {"restart", w.restarts}, {"after_s", delay_s},
                                        {"reason", w.watchdog ? "watchdog" : "lost"}}));
    w.watchdog = false;
    w.started_s = wall_s() + delay_s;
    return {.kind = ExitAction::Kind::kRestart,
            .delay = std::chrono::milliseconds(int64_t(delay_s * 1000)),
            .spec = {.name = w.name, .argv = w.argv, .env = env_}};
  }

  void tick() {
    if (!ended_) {
      watch_steps();
      for (size_t i = 0; i < workers_.size(); ++i)
        if (!sup_->running(int(i)) && stopped_cleanly(sup_->status(int(i)))) ended_ = now_s();
      return;
    }
    if (now_s() - ended_ < grace_.count() / 1000.0) return;
    for (size_t i = 0; i < workers_.size(); ++i)
      if (sup_->running(int(i)) && !workers_[i].last_step) sup_->kill_child(int(i));
  }

  // Why the run failed where a worker could have been restarted ("" otherwise).
  const std::string& why() const { return why_; }

 private:
  static constexpr double kMaxBackoffS = 60.0;

  static double wall_s() {  // the clock of file times
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  void watch_steps() {
    if (fault_.step_timeout_s <= 0) return;
    const double now = wall_s();
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& w = workers_[i];
      struct stat st {};
      if (!sup_->running(int(i)) || w.last_step || w.watchdog ||
          ::stat(progress_path(run_dir_, w.island, w.rank).c_str(), &st) != 0)
        continue;
      const double touched = double(st.st_mtim.tv_sec) + double(st.st_mtim.tv_nsec) * 1e-9;
      if (touched < w.started_s || now - touched <= fault_.step_timeout_s) continue;
      std::fprintf(stderr, "atoll: %s has not begun a step for %.1f s (fault.step_timeout_s = %g): killed by the "
                   "watchdog, to be restarted\n", w.name.c_str(), now - touched, fault_.step_timeout_s);
      w.watchdog = true;
      sup_->kill_child(int(i));
    }
  }

  bool another_island_whole(int island) const {
    std::map<int, bool> whole;
    for (size_t i = 0; i < workers_.size(); ++i) {
      auto [it, fresh] = whole.emplace(workers_[i].island, true);
      it->second = it->second && sup_->running(int(i));
    }
    for (const auto& [i, w] : whole)
      if (i != island && w) return true;
    return false;
  }

  FaultConfig fault_;
  int64_t steps_;
  JsonlWriter& events_;
  std::chrono::milliseconds grace_;
  std::vector<std::string> env_;  // every worker's additions to the environment
  std::string run_dir_;
  Supervisor* sup_ = nullptr;
  std::vector<Worker> workers_;
  bool started_ = false;
  double ended_ = 0;  // when a worker first finished (0: not yet)
  std::string why_;
};

// The launcher's error line for a failed worker: its own error message, without its prefix.
[[noreturn]] void throw_worker_failed(const std::string& name, const ChildExit& e, const std::string& restart_why) {
  std::string why = e.last_error.empty() ? "no error message" : e.last_error.substr(e.last_error.find(':') + 1);
  while (!why.empty() && why.front() == ' ') why.erase(0, 1);
  if (why.rfind("error: ", 0) == 0) why.erase(0, 7);
  if (why.find("fix") == std::string::npos) why += "; fix: see the worker's output above";
  throw Error(name + " failed (" + e.describe() + ")" + restart_why + ", every worker stopped: " + why);
}

}  // namespace

int launch(const LaunchOptions& o) {
  const Config& cfg = o.config;
  const int N = o.islands, M = o.workers_per_island, W = N * M;
  check_island_placement(cfg, M);  // before any worker starts
  check_memory_fits(cfg, {.processes = W, .workers_per_island = M});  // every worker on this machine, before the data is prepared
  if (o.resume && o.run_dir.empty()) throw ConfigError("--resume needs --run-dir; fix: pass the run directory to continue");
  const std::string run_dir = o.run_dir.empty() ? default_run_dir() : o.run_dir;
  if (o.print_config)
    std::printf("# resolved config (%s)\n%s\n", o.config_path.empty() ? "built-in defaults" : o.config_path.c_str(),
                config_to_toml(cfg).c_str());
  else
    std::printf("%s; %d islands x %d workers\n", describe_run(cfg, run_dir).c_str(), N, M);
  std::fflush(stdout);
  const double t_start = now_s();
  LiveView live({.port = o.status_port, .host = o.status_host, .islands = N, .workers_per_island = M}, cfg,
                std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  // Held until launch returns: the workers it starts write the folder under this lock.
  RunDir rd = open_run_dir(run_dir, cfg, {.resume = o.resume, .allow_config_change = o.allow_config_change});
  const DatasetInfo data = resolve_dataset(cfg);  // prepared once here, so the workers find it ready
  int64_t resume_step = 0;
  nlohmann::json reshape;  // a resume on another shape: what is kept and dropped (state_checkpoint.h)
  if (!rd.checkpoint.empty()) {  // refused here, before any worker starts, if it cannot resume
    const nlohmann::json manifest = read_training_manifest(rd.checkpoint);
    check_resume(manifest, rd.checkpoint, cfg, N, M, /*diloco=*/true);
    resume_step = manifest.at("step").get<int64_t>();
    reshape = describe_reshape(manifest, N, M);
  }
  nlohmann::json init_event;  // checked whole here, before anything is written; each worker reads the weights
  if (!o.init_from.empty()) {
    if (!rd.checkpoint.empty())
      throw RunDirConflict(rd.path + " already has checkpoints; --init-from starts a new run only (fix: another --run-dir)");
    init_event = init_from_hf(o.init_from, cfg, data, nullptr);
  }
  std::unique_ptr<RedisServer> redis;
  const std::chrono::milliseconds timeout(int64_t(cfg.fault.timeout_s * 1000));
  const StoreAddress store_address = open_store(o.store, timeout, &redis);
  const std::string store = store_address.url();
  begin_run(rd, cfg);
  // Trust at the door (docs/islands.md): the run's token, and the password of our own store, in
  // files only the owner reads; workers get both through their environment.
  const std::string run_token = random_secret();
  write_secret_file(rd.path + "/run.token", run_token);
  if (redis) write_secret_file(rd.path + "/store.password", store_address.password);
  if (!data.tokenizer_path.empty())  // so `atoll generate` and `atoll export` find it, as for `atoll train`
    std::filesystem::copy_file(data.tokenizer_path, rd.path + "/tokenizer.model",
                               std::filesystem::copy_options::overwrite_existing);
  // Rows after the checkpoint are logged again by the resumed run.
  if (rd.resumed) truncate_jsonl_after_step(rd.path + "/metrics.jsonl", resume_step);
  JsonlWriter events(rd.path + "/events.jsonl");
  MetricsLog metrics(rd.path);
  metrics.on_eval = [&rd] { write_run_report(rd.path); };  // report.html at each evaluation
  const int64_t params = ParamLayout::build(cfg.model).n_params();  // the report's summary reads it here
  events.write(event_row("launch", {{"islands", N}, {"workers_per_island", M}, {"store", store}, {"params", params}}));
  record_resume(events, rd, resume_step);
  if (!init_event.is_null()) events.write(event_row("init_from", init_event));
  if (!reshape.is_null()) {
    reshape["step"] = resume_step;
    events.write(event_row("reshape", reshape));
    std::printf("resuming a %s checkpoint as %s: kept %s%s\n", reshape["from"].get<std::string>().c_str(),
                reshape["to"].get<std::string>().c_str(), reshape["kept"].get<std::string>().c_str(),
                reshape.contains("dropped") ? ("; dropped " + reshape["dropped"].get<std::string>()).c_str() : "");
  }

  // Cores shared out when train.threads = 0 (all cores), so W workers do not oversubscribe.
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = cfg.train.threads > 0 ? cfg.train.threads : std::max(1, cores / W);
  const std::string run_id = make_run_id();
  write_run_id(rd.path, run_id);  // where a worker started by hand finds the run (`atoll worker --run-dir`)
  // The live view reads the members' records, authenticated with the run's keys when sealed (dist/seal.h).
  const StoreOptions store_options{.url = store, .password = store_address.password, .run_id = run_id, .timeout = timeout,
                                   .records = cfg.dist.seal ? std::make_shared<const Sealer>(run_token) : nullptr};
  live.set_run(run_id, rd.path, store_options);
  {
    Store s(store_options);
    publish_run_token(s, run_token);  // before any worker can register
  }
  char run_start[32];
  std::snprintf(run_start, sizeof run_start, "%.6f", run_start_wall_s(rd.path));
  std::vector<std::string> env = {"OMP_WAIT_POLICY=passive", "ATOLL_RUN_TOKEN=" + run_token,
                                  std::string("ATOLL_RUN_START=") + run_start};
  if (!store_address.password.empty()) env.push_back("ATOLL_STORE_PASSWORD=" + store_address.password);
  LaunchView view(cfg.train.steps, resume_step, &metrics);
  RestartPolicy policy(cfg, events, o.stop_grace, env, rd.path);
  auto& workers = policy.workers();
  Supervisor sup({.stop_grace = o.stop_grace,
                  .signal_grace = std::chrono::milliseconds(int64_t(cfg.checkpoint.grace_s * 1000)),
                  .on_output = [&](int c, const std::string& line) { view.output(workers[size_t(c)].name, line); },
                  .on_metrics = [&](int c, const std::string& line) {
                    const nlohmann::json r = view.row(c, line);
                    if (is_phase_line(r)) live.phase(c, r["phase"].is_string() ? r["phase"].get<std::string>() : "");
                    else if (!r.is_null()) policy.row(c, r), live.row(c, r);
                  },
                  .on_exit = [&](int c, const ChildExit& e) {
                    ExitAction a = policy.on_exit(c, e);
                    if (a.kind == ExitAction::Kind::kFail)
                      live.set_state("failed", workers[size_t(c)].name + " failed (" + e.describe() + ")" + policy.why() +
                                                   (e.last_error.empty() ? "" : ": " + e.last_error));
                    return a;
                  },
                  .on_tick = [&] {
                    policy.tick();
                    live.tick(sup);
                    if (redis) keep_store_alive(*redis, store_options, run_token, events);
                  }});
  policy.attach(&sup);
  for (int i = 0; i < N; ++i)
    for (int r = 0; r < M; ++r) {
      const RestartPolicy::Worker& w = workers.emplace_back(RestartPolicy::Worker{
          .name = "island " + std::to_string(i) + " rank " + std::to_string(r), .island = i, .rank = r,
          .argv = worker_argv(o, rd, store, run_id, threads, i, r, /*join=*/true)});
      sup.spawn({.name = w.name, .argv = worker_argv(o, rd, store, run_id, threads, i, r, false), .env = env});
    }
  live.tick(sup);
  live.set_state("running");
  // However the run ends, every worker is gone when sup.run() returns or throws (the launcher's
  // own error, such as a metrics row it cannot write to a full disk): the store is stopped and
  // the checkpoints the workers left half written are removed, naming each, so that the space a
  // full disk needs is free again. The run's lock goes with `rd`.
  const auto wind_down = [&] {
    view.finish();
    live.close_store();
    if (redis) redis->stop();
    remove_leftover_writes(rd.path);
    write_run_report(rd.path);  // however it ended; rewritten below with the summary of a run that completes
  };
  SupervisorOutcome out;
  try {
    out = sup.run();
  } catch (const std::exception& e) {
    live.set_state("failed", e.what());
    wind_down();
    throw;
  } catch (...) {
    wind_down();
    throw;
  }
  live.set_state(out.interrupted ? "interrupted" : "finished");  // a failure set already stands
  wind_down();
  const std::string latest = latest_checkpoint(rd.path);
  const bool all_stopped_cleanly =
      std::all_of(out.children.begin(), out.children.end(), [](const ChildExit& e) { return stopped_cleanly(e); });
  if (out.interrupted && out.signal == SIGTERM && all_stopped_cleanly) {  // preemption: nothing lost
    events.write(event_row("preempted", {{"signal", out.signal}, {"checkpoint", latest}}));
    std::fprintf(stderr, "atoll: preempted (SIGTERM): every worker stopped after writing the final checkpoint %s; "
                 "resume with: atoll launch --islands %d --workers-per-island %d --run-dir %s --resume\n",
                 latest.c_str(), N, M, rd.path.c_str());
    return 0;
  }
  if (out.interrupted) {
    events.write(event_row("interrupted", {{"signal", out.signal}, {"checkpoint", latest}}));
    std::fprintf(stderr, "atoll: interrupted (signal %d): every worker stopped; last complete checkpoint: %s\n", out.signal,
                 latest.empty() ? "none" : latest.c_str());
    return 128 + out.signal;
  }
  if (out.failed >= 0) {
    const ChildExit& e = out.children[size_t(out.failed)];
    const std::string& name = workers[size_t(out.failed)].name;
    events.write(event_row("worker_failed", {{"worker", name}, {"status", e.describe()}, {"error", e.last_error}}));
    throw_worker_failed(name, e, policy.why());
  }
  // A worker stopped by SIGTERM (preempted on its own) stops the whole run at a step it posts.
  const int64_t latest_step = latest.empty() ? 0 : read_checkpoint_manifest(latest).at("step").get<int64_t>();
  if (latest_step < cfg.train.steps) {
    events.write(event_row("preempted", {{"step", latest_step}, {"checkpoint", latest}}));
    std::fprintf(stderr, "atoll: a worker was stopped by a signal: the run stopped at step %ld with checkpoint %s; "
                 "resume with: atoll launch --islands %d --workers-per-island %d --run-dir %s --resume\n",
                 long(latest_step), latest.c_str(), N, M, rd.path.c_str());
    return 0;
  }
  events.write(event_row("end", {{"step", cfg.train.steps}}));
  char summary[512];
  std::snprintf(summary, sizeof summary,
                "run %s: %ld parameters, %d islands x %d workers, %ld steps, %ld outer steps (%ld with differing "
                "theta_hash) in %.1f s\n"
                "final checkpoint %s\n",
                rd.path.c_str(), long(params), N, M, long(cfg.train.steps), long(view.outer_steps()), long(view.split_hashes()),
                now_s() - t_start, latest.c_str());
  std::printf("\n%s", summary);
  std::ofstream(rd.path + "/summary.txt") << summary;
  write_run_report(rd.path);
  return view.split_hashes() == 0 ? 0 : 3;
}

}  // namespace atl
