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

#include "atoll/ckpt/checkpoint.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/core/timer.h"
#include "atoll/dist/diloco.h"
#include "atoll/dist/fragments.h"
#include "atoll/dist/streaming.h"
#include "atoll/dist/group.h"
#include "atoll/dist/store.h"
#include "atoll/optim/clip.h"
#include "atoll/optim/schedule.h"
#include "atoll/train/dataset.h"
#include "atoll/train/driver.h"
#include "atoll/train/island_hooks.h"
#include "atoll/train/loop.h"
#include "atoll/train/metrics.h"
#include "atoll/train/run_dir.h"
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

// Checkpoint kinds of island i's own buffers: island 0 uses the plain names ("param", "adam_m",
// ...), so `atoll eval` / `export` read island 0's parameters; island i > 0 saves
// "island<i>_param", "island<i>_adam_m", ...
std::string island_kind(int island, const std::string& kind) {
  return island == 0 ? kind : "island" + std::to_string(island) + "_" + kind;
}

// Every worker's training state into one checkpoint written by worker 0, following the
// checkpoint contract (ckpt/checkpoint.h: one writing rank, tensors by name, the state in the
// manifest). Ranks of an island hold bit-identical parameters and moments, so each island's rank
// 0 sends its own (param, adam_m, ...) to worker 0 over outer-r0, saved as island_kind(i, kind);
// the loader cursors of all W workers are gathered (island group, then outer-r0) into
// state["loaders"][w]. The buffers are gathered to worker 0 only, one kind at a time (an
// all-gather once gave every island's rank 0 a copy of all N islands' buffers, which ran a
// 4-island small-config run out of memory). Until the sharded writer exists, worker 0 holds
// N islands' buffers while it writes. Returns the checkpoint's directory on worker 0, "" elsewhere.
std::string save_worker(const Config& cfg, const std::string& run_dir, int island, int rank, int N, int M,
                        ProcessGroup& inner, ProcessGroup& outer, Loop& loop, DilocoSync& diloco) {
  const size_t n = loop.engine->layout().total();
  const std::vector<std::string> cursors = inner.allgather(nlohmann::json(loop.train_data.cursor()).dump());
  std::vector<float> residual;  // the island's error-feedback residual, in θ's layout
  if (cfg.diloco.error_feedback) {
    residual.resize(n);
    diloco.residual(residual.data());
    inner.allreduce_sum(residual.data(), n);  // the ranks' shards: disjoint, so the sum is exact
  }
  if (rank != 0) return "";
  const std::string island_cursors = nlohmann::json(cursors).dump();
  std::vector<CheckpointBuffer> own = loop.buffers();
  if (cfg.diloco.error_feedback) own.push_back({"diloco_residual", residual.data()});
  const std::vector<std::string> all_cursors = outer.allgather(island_cursors);
  // gathered[j]: kind j of every island, [N, n] (worker 0 only; island 0's slot is its own copy).
  std::vector<std::vector<float>> gathered(island == 0 && N > 1 ? own.size() : 0);
  for (size_t j = 0; N > 1 && j < own.size(); ++j) {
    if (island == 0) gathered[j].resize(size_t(N) * n);
    outer.gather(own[j].data, n * sizeof(float), island == 0 ? gathered[j].data() : nullptr, 0);
  }
  if (island != 0) return "";

  std::vector<CheckpointBuffer> buffers = own;
  for (int i = 1; i < N; ++i)
    for (size_t j = 0; j < own.size(); ++j)
      buffers.push_back({island_kind(i, own[j].kind), gathered[j].data() + size_t(i) * n});
  buffers.push_back({"diloco_theta", diloco.theta().data()});
  buffers.push_back({"diloco_momentum", diloco.momentum().data()});
  nlohmann::json state = loop.state();  // its "loader" is worker 0's, as `atoll train` writes it
  nlohmann::json loaders = nlohmann::json::array();
  for (int i = 0; i < N; ++i) {
    const auto island_list = nlohmann::json::parse(all_cursors[size_t(i)]);
    ATOLL_CHECK_EQ(island_list.size(), size_t(M));
    for (const auto& c : island_list) loaders.push_back(nlohmann::json::parse(c.get<std::string>()));
  }
  state["loaders"] = loaders;  // by global worker index w = island * M + rank
  state["islands"] = N;
  state["workers_per_island"] = M;
  state["outer_step"] = diloco.outer_step();
  state["fragments"] = diloco.fragments();
  state["fragment_outer_steps"] = diloco.fragment_outer_steps();
  state["error_feedback_residual"] = cfg.diloco.error_feedback;  // island_kind(i, "diloco_residual")
  return save_checkpoint({.run_dir = run_dir, .step = loop.step, .keep = cfg.checkpoint.keep}, cfg,
                         loop.engine->layout(), buffers, state);
}

// Worker w of island `island` takes its island's parameters, moments and error-feedback
// residual, θ, the outer momentum, its own loader cursor and the outer step counts from
// checkpoint `dir` (whose manifest's state is `saved`).
void restore_worker(const std::string& dir, const nlohmann::json& saved, const Config& cfg, int island, int w,
                    Loop& loop, DilocoSync& diloco) {
  std::vector<CheckpointBuffer> buffers;
  for (const CheckpointBuffer& b : loop.buffers()) buffers.push_back({island_kind(island, b.kind), b.data});
  buffers.push_back({"diloco_theta", diloco.theta().data()});
  buffers.push_back({"diloco_momentum", diloco.momentum().data()});
  const bool has_residual = saved.value("error_feedback_residual", false);
  std::vector<float> residual;
  if (cfg.diloco.error_feedback && has_residual) {
    residual.resize(loop.engine->layout().total());
    buffers.push_back({island_kind(island, "diloco_residual"), residual.data()});
  }
  nlohmann::json state = load_checkpoint(dir, cfg.model, loop.engine->layout(), buffers);
  state["loader"] = state.at("loaders").at(size_t(w));
  loop.restore(state);
  diloco.set_fragment_outer_steps(state.at("fragment_outer_steps").get<std::vector<int64_t>>());
  if (!residual.empty()) diloco.set_residual(residual.data());
  // A checkpoint written without error feedback has no residual: it starts from zero.
  if (cfg.diloco.error_feedback && !has_residual && w == 0)
    log_warn("resuming with diloco.error_feedback from " + dir + ", written without it: the quantization residual "
             "starts from zero");
}

}  // namespace

void check_resume(const nlohmann::json& state, const std::string& dir, const Config& cfg, int islands,
                  int workers_per_island) {
  if (!state.contains("islands") || !state.contains("workers_per_island") || !state.contains("loaders"))
    throw ConfigError("checkpoint " + dir + " was not written by a multi-island run (`atoll launch`); fix: resume it "
                      "with `atoll train --resume`, or start a new --run-dir");
  const int n = state["islands"].get<int>(), m = state["workers_per_island"].get<int>();
  if (n != islands || m != workers_per_island)
    throw ConfigError("checkpoint " + dir + " holds a run of " + std::to_string(n) + " islands x " + std::to_string(m) +
                      " workers, not --islands " + std::to_string(islands) + " --workers-per-island " +
                      std::to_string(workers_per_island) + "; fix: resume with --islands " + std::to_string(n) +
                      " --workers-per-island " + std::to_string(m));
  const int p = state.value("fragments", 1);
  if (p != cfg.diloco.fragments)
    throw ConfigError("checkpoint " + dir + " was written with diloco.fragments = " + std::to_string(p) + ", not " +
                      std::to_string(cfg.diloco.fragments) + "; fix: resume with --set diloco.fragments=" +
                      std::to_string(p));
}

std::string shared_config_toml(const Config& cfg) {
  Config c = cfg;
  c.train.device = Config().train.device;
  return island_config_toml(c);
}

WorkerResult run_worker(const Config& cfg, const WorkerOptions& opts) {
  validate_streaming(cfg.diloco, cfg.model.n_layers);
  const int N = opts.islands, M = opts.workers_per_island, W = N * M;
  check_island_device(cfg.train, M);  // cuda with M > 1 needs NCCL: refused before any rendezvous
  ATOLL_CHECK(N >= 1 && M >= 1 && opts.island >= 0 && opts.island < N && opts.rank >= 0 && opts.rank < M)
      << "island " << opts.island << " of " << N << ", rank " << opts.rank << " of " << M;
  const int w = opts.island * M + opts.rank;
  const bool resume = !opts.resume_from.empty();
  const std::string who = "island " + std::to_string(opts.island) + " rank " + std::to_string(opts.rank);
  const double t_start = now_s();
  const auto timeout = std::chrono::milliseconds(int64_t(cfg.fault.timeout_s * 1000));
  configure_threads(cfg.train.threads);
  const DatasetInfo data = resolve_dataset(cfg);
  const std::string run_dir = opts.run_dir.empty() ? default_run_dir() : opts.run_dir;
  // Without a launcher, worker 0 owns the run folder: checked before any peer can write to it.
  RunDir rd;
  rd.path = run_dir;
  if (w == 0 && opts.metrics_fd < 0) rd = inspect_run_dir(run_dir, cfg, resume);

  // train.device = cuda: the step runs on GPU `rank` (modulo the devices); the engine's host
  // copies serve initialisation, DiLoCo's outer step and checkpoints.
  Loop loop(cfg, data.dir, {.worker = w, .n_workers = W, .device_index = opts.rank});
  Engine& engine = *loop.engine;
  engine.init_params(uint64_t(cfg.model.init_seed));
  const size_t n = engine.layout().total();
  nlohmann::json resume_state;
  if (resume) {  // before any peer waits on us: a refused checkpoint ends this worker at once
    resume_state = read_checkpoint_manifest(opts.resume_from).at("state");
    check_resume(resume_state, opts.resume_from, cfg, N, M);
  }

  // Rendezvous, bounded by fault.timeout_s: the store must answer and every peer arrive.
  std::unique_ptr<Store> store;
  std::unique_ptr<ProcessGroup> inner_group, outer_group;
  try {
    store = std::make_unique<Store>(StoreOptions{.url = opts.store_url, .run_id = opts.run_id, .timeout = timeout});
    inner_group = std::make_unique<ProcessGroup>(
        *store, GroupOptions{.name = "island" + std::to_string(opts.island), .rank = opts.rank, .size = M,
                             .timeout = timeout});
    outer_group = std::make_unique<ProcessGroup>(
        *store, GroupOptions{.name = "outer-r" + std::to_string(opts.rank), .rank = opts.island, .size = N,
                             .connections = cfg.diloco.connections, .timeout = timeout});
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
    expect_same(*g, who, "initial parameters (xxh3)", hash_floats(engine.host().params, n));
    expect_same(*g, who, "step resumed from", resume ? resume_state.at("step").dump() : "none (a fresh start)");
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
  if (resume) restore_worker(opts.resume_from, resume_state, cfg, opts.island, w, loop, diloco);
  loop.engine->to_device(kAllState);  // the initial or restored parameters and moments (a no-op on the CPU)
  if (w == 0 && opts.metrics_fd < 0) {
    write_run_config(rd, cfg);
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
             return save_worker(cfg, run_dir, opts.island, opts.rank, N, M, inner, outer, loop, diloco);
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
