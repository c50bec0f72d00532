#include "atoll/train/island_trainer.h"

#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/core/timer.h"
#include "atoll/dist/diloco.h"
#include "atoll/dist/fragments.h"
#include "atoll/dist/streaming.h"
#include "atoll/dist/group.h"
#include "atoll/dist/store.h"
#include "atoll/engine/memory_estimate.h"
#include "atoll/optim/clip.h"
#include "atoll/optim/schedule.h"
#include "atoll/train/dataset.h"
#include "atoll/train/driver.h"
#include "atoll/train/island_hooks.h"
#include "atoll/train/loop.h"
#include "atoll/train/metrics.h"
#include "atoll/train/run_dir.h"
#include "atoll/train/state_checkpoint.h"
#include "atoll/train/trainer.h"

namespace atl {
namespace {

// Where rows go: the launcher's pipe (one write per line, so the launcher reads whole lines),
// or the run's metrics.jsonl.
class RowSink {
 public:
  RowSink(int fd, const std::string& path) : fd_(fd) {
    if (fd_ < 0) file_ = JsonlWriter(path);
  }
  void write(const nlohmann::json& row) {
    if (fd_ < 0) return file_.write(row);
    const std::string line = row.dump() + "\n";
    for (size_t done = 0; done < line.size();) {
      const ssize_t w = ::write(fd_, line.data() + done, line.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw IoError("metrics pipe to the launcher: " + std::string(std::strerror(errno)));
      done += size_t(w);
    }
  }

 private:
  int fd_;
  JsonlWriter file_;
};

// "island 1 rank 0": a worker as messages name it.
std::string worker_name(int island, int rank) {
  return "island " + std::to_string(island) + " rank " + std::to_string(rank);
}

// Runs a start-up comparison in `group`, turning a mismatch into an error that says who and how
// to fix it.
void expect_same(ProcessGroup& group, const std::string& who, const std::string& what, const std::string& value) {
  try {
    group.expect_same(what, value);
  } catch (const ConfigError& e) {
    std::string what = e.what();  // TOML excerpts: one line, so the error stays one line
    for (size_t at; (at = what.find('\n')) != std::string::npos;) what.replace(at, 1, " / ");
    throw ConfigError(who + ": " + what +
                      "; fix: start every worker with the same --config and --set (only train.threads, "
                      "train.device and data.dir may differ, train.device only between islands)");
  }
}

// What the workers of one island must agree on: shared_config_toml plus train.device, since
// their gradient mean runs over NCCL on the GPU and over Gloo on the CPU. For CPU islands this
// is the same text as shared_config_toml (train.device = "cpu" is the default).
std::string island_config_toml(const Config& cfg) {
  Config c = cfg;
  const Config defaults;
  c.train.threads = defaults.train.threads;
  c.data.dir = defaults.data.dir;
  return config_to_toml(c);
}

// The fragment plan of the model's layout (dist/fragments.h).
FragmentPlan model_fragments(const ParamLayout& layout, int fragments) {
  std::vector<TensorSpan> spans;
  for (const ParamEntry& e : layout.entries()) spans.push_back({e.name, e.offset, e.numel, e.layer});
  return plan_fragments(spans, layout.total(), fragments);
}

// After start-up (a fresh start or a resume): the island's ranks must hold the same state where
// the registry says it is replicated in the island or run-wide, and the islands the same
// run-wide state (θ, the outer momentum, the counters), compared by hash. A difference is a bug
// or workers resumed from different checkpoints.
void expect_same_state(ProcessGroup& inner, ProcessGroup& outer, const std::string& who,
                       const std::vector<StateEntry>& entries, const ParamLayout& layout) {
  using D = Division;
  try {
    inner.expect_same("training state (xxh3)",
                      state_hash(entries, layout, {D::kRun, D::kReplicatedInIsland, D::kPerIsland}));
    outer.expect_same("run-wide training state (xxh3)", state_hash(entries, layout, {D::kRun}));
  } catch (const ConfigError& e) {
    throw Error(who + ": " + e.what() + " after start-up; fix: start every worker from the same checkpoint "
                "(--resume-from) and the same config");
  }
}

}  // namespace

std::string shared_config_toml(const Config& cfg) {
  Config c = cfg;
  c.train.device = Config().train.device;
  return island_config_toml(c);
}

WorkerResult run_worker(const Config& cfg, const WorkerOptions& opts) {
  validate_streaming(cfg.diloco, cfg.model.n_layers);
  const int N = opts.islands, M = opts.workers_per_island, W = N * M;
  check_island_device(cfg.train, M);  // cuda with M > 1 needs NCCL: refused before any rendezvous
  check_memory_fits(cfg, {.device_index = opts.rank});  // before the data or anything is allocated
  ATOLL_CHECK(N >= 1 && M >= 1 && opts.island >= 0 && opts.island < N && opts.rank >= 0 && opts.rank < M)
      << "island " << opts.island << " of " << N << ", rank " << opts.rank << " of " << M;
  const int w = opts.island * M + opts.rank;
  const bool resume = !opts.resume_from.empty();
  const std::string who = worker_name(opts.island, opts.rank);
  const double t_start = now_s();
  const auto timeout = std::chrono::milliseconds(int64_t(cfg.fault.timeout_s * 1000));
  const std::string run_dir = opts.run_dir.empty() ? default_run_dir() : opts.run_dir;
  // Without a launcher, worker 0 owns the run folder: checked and locked before any peer can
  // write to it (a launcher holds the lock for the workers it starts). The workers' configs are
  // compared with one another at start-up (expect_same below), which is what a by-hand run
  // needs, so a change against the run's config.toml is logged rather than refused.
  RunDir rd;
  rd.path = run_dir;
  if (w == 0 && opts.metrics_fd < 0) rd = open_run_dir(run_dir, cfg, {.resume = resume, .allow_config_change = true});
  configure_threads(cfg.train.threads);
  const DatasetInfo data = resolve_dataset(cfg);

  // train.device = cuda: the step runs on GPU `rank` (modulo the devices); the engine's host
  // copies serve initialisation, DiLoCo's outer step and checkpoints.
  Loop loop(cfg, data.dir, {.worker = w, .n_workers = W, .device_index = opts.rank});
  Engine& engine = *loop.engine;
  engine.init_params(uint64_t(cfg.model.init_seed));
  const size_t n = engine.layout().total();
  nlohmann::json manifest;
  if (resume) {  // before any peer waits on us: a refused checkpoint ends this worker at once
    manifest = read_training_manifest(opts.resume_from);
    check_resume(manifest, opts.resume_from, cfg, N, M, /*diloco=*/true);
  }

  // Rendezvous, bounded by fault.timeout_s: the store must answer and every peer arrive.
  std::unique_ptr<Store> store;
  std::unique_ptr<ProcessGroup> inner_group, outer_group;
  try {
    store = std::make_unique<Store>(StoreOptions{.url = opts.store_url, .run_id = opts.run_id, .timeout = timeout});
    // Members named as the run knows them, in errors (a stalled peer, a size mismatch).
    inner_group = std::make_unique<ProcessGroup>(
        *store, GroupOptions{.name = "island" + std::to_string(opts.island), .rank = opts.rank, .size = M,
                             .timeout = timeout,
                             .member_name = [I = opts.island](int r) { return worker_name(I, r); }});
    outer_group = std::make_unique<ProcessGroup>(
        *store, GroupOptions{.name = "outer-r" + std::to_string(opts.rank), .rank = opts.island, .size = N,
                             .connections = cfg.diloco.connections, .timeout = timeout,
                             .member_name = [R = opts.rank](int i) { return worker_name(i, R); }});
  } catch (const GroupSizeMismatch& e) {
    // Gloo would fail on address blocks of another length ("136 vs 68"); say which flag differs.
    const bool islands = inner_group != nullptr;  // the in-island group formed: the outer one differs
    const std::string flag = islands ? "--islands" : "--workers-per-island";
    auto started = [&](int member, int size, const char* joint) {
      return (islands ? "island " + std::to_string(member) : worker_name(opts.island, member)) + joint + flag + " " +
             std::to_string(size);
    };
    const bool peer_first = e.peer > e.rank;
    throw ConfigError(who + ": " +
                      (peer_first ? started(e.peer, e.peer_size, " was started with ") + ", " +
                                        started(e.rank, e.size, " with ")
                                  : started(e.rank, e.size, " was started with ") + ", " +
                                        started(e.peer, e.peer_size, " with ")) +
                      "; fix: start every worker of the run with the same --islands and --workers-per-island "
                      "(and the same --run-id; a new run id for a new run)");
  } catch (const Timeout& e) {
    char bound[64];
    std::snprintf(bound, sizeof bound, " (the bound is fault.timeout_s = %g)", cfg.fault.timeout_s);
    std::string msg = who + ": " + e.what() + bound;
    if (msg.find("fix") == std::string::npos)
      msg += "; fix: start all " + std::to_string(W) + " workers with the same --store, --run-id, --islands and "
             "--workers-per-island, or raise fault.timeout_s";
    throw Timeout(msg);
  }
  ProcessGroup& inner = *inner_group;
  ProcessGroup& outer = *outer_group;
  for (ProcessGroup* g : {&inner, &outer}) {
    expect_same(*g, who, "model config", model_config_to_toml(cfg.model));
    expect_same(*g, who, "config", g == &inner ? island_config_toml(cfg) : shared_config_toml(cfg));
    expect_same(*g, who, "step resumed from", resume ? manifest.at("step").dump() : "none (a fresh start)");
  }
  // The island's NCCL communicator, on the GPU with M > 1 (check_island_device on every rank
  // before anyone waits on another).
  check_island_device(cfg.train, M);
  engine.join_island({.rank = opts.rank, .size = M, .timeout = inner.timeout(),
                      .allgather = [&](const std::string& s) { return inner.allgather(s); }});
  DilocoSync diloco(outer, engine.host().params, n,
                    {.outer_lr = cfg.diloco.outer_lr,
                     .outer_momentum = cfg.diloco.outer_momentum,
                     .ring = {.codec = parse_codec(cfg.diloco.codec),
                              .chunk_bytes = size_t(cfg.diloco.chunk_kb) * 1024,
                              .timeout = timeout,
                              .error_feedback = cfg.diloco.error_feedback,
                              .compress = cfg.diloco.compress == "zstd"}},
                    model_fragments(engine.layout(), cfg.diloco.fragments), &inner);
  StreamingDiloco streaming(diloco, outer,
                            {.inner_steps = cfg.diloco.inner_steps,
                             .overlap_steps = cfg.diloco.overlap_steps,
                             .mixing = cfg.diloco.mixing});
  TrainingState state{.loop = loop, .diloco = &diloco};
  const StatePlace place{.island = opts.island, .rank = opts.rank, .islands = N, .workers_per_island = M,
                         .inner = &inner, .outer = &outer};
  if (resume) restore_training_state(opts.resume_from, manifest, cfg, state, place);
  expect_same_state(inner, outer, who, state_registry(cfg, true, &state), engine.layout());
  loop.engine->to_device(kAllState);  // the initial or restored parameters and moments (a no-op on the CPU)
  if (w == 0 && opts.metrics_fd < 0) {
    begin_run(rd, cfg);
    if (resume) truncate_jsonl_after_step(run_dir + "/metrics.jsonl", loop.step);
  }
  std::filesystem::create_directories(run_dir);
  RowSink rows(opts.metrics_fd, run_dir + "/metrics.jsonl");
  std::unique_ptr<JsonlWriter> events;
  if (w == 0) events = std::make_unique<JsonlWriter>(run_dir + "/events.jsonl");
  if (w == 0 && resume && opts.metrics_fd < 0)
    events->write({{"event", "resume"}, {"step", loop.step}, {"checkpoint", opts.resume_from}});
  if (!opts.quiet)
    log_info(who + ": " + std::to_string(engine.layout().n_params()) + " parameters, data slice " +
             std::to_string(w) + " of " + std::to_string(W) + ", " + std::to_string(diloco.fragments()) +
             " fragment(s)" + (resume ? ", resumed at step " + std::to_string(loop.step) : ""));

  IslandHooks hooks(cfg, {.island = opts.island, .rank = opts.rank, .islands = N, .workers_per_island = M, .who = who},
                    inner, outer, diloco, streaming, events.get());
  const DriverResult r = run_steps(
      loop, hooks,
      {.who = who,
       .workers = W,
       .evaluates = w == 0,
       .write_row = [&](const nlohmann::json& row) { rows.write(row); },
       .save =
           [&] {
             loop.engine->to_host(kAllState);  // parameters and moments from the GPU (a no-op on the CPU)
             return save_training_state(cfg, run_dir, state, place);
           },
       .events = events.get(),
       .t_start = t_start});
  if (w == 0) events->write({{"event", "end"}, {"step", loop.step}});
  WorkerResult result;
  result.steps = loop.step;
  result.outer_steps = diloco.outer_step();
  result.first_loss = r.first_loss;
  result.final_loss = r.final_loss;
  result.theta_hash = hooks.theta_hash().empty() ? diloco.theta_hash() : hooks.theta_hash();
  return result;
}

}  // namespace atl
