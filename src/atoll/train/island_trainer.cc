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
  const size_t n = loop.model.layout().total();
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
                         loop.model.layout(), buffers, state);
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
    residual.resize(loop.model.layout().total());
    buffers.push_back({island_kind(island, "diloco_residual"), residual.data()});
  }
  nlohmann::json state = load_checkpoint(dir, cfg.model, loop.model.layout(), buffers);
  state["loader"] = state.at("loaders").at(size_t(w));
  loop.restore(state);
  diloco.set_fragment_outer_steps(state.at("fragment_outer_steps").get<std::vector<int64_t>>());
  if (!residual.empty()) diloco.set_residual(residual.data());
  // A checkpoint written without error feedback has no residual: it starts from zero.
  if (cfg.diloco.error_feedback && !has_residual && w == 0)
    log_warn("resuming with diloco.error_feedback from " + dir + ", written without it: the quantization residual "
             "starts from zero");
}

void scale(float* x, size_t n, double s) {
  const float f = float(s);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) x[i] *= f;
}

// The end of the data-parallel warm start: θ ← the warm parameters, which every island must hold
// bit for bit (compared by hash across islands, so a broken warm start stops the run here rather
// than drifting silently). The outer momentum is still zero. Returns θ's hash.
std::string start_diloco(DilocoSync& diloco, ProcessGroup& outer, const std::string& who, const float* params) {
  std::vector<float>& theta = diloco.theta();
  std::copy(params, params + theta.size(), theta.begin());
  const std::string hash = diloco.theta_hash();
  try {
    outer.expect_same("parameters after the data-parallel warm start (xxh3)", hash);
  } catch (const ConfigError& e) {
    throw Error(who + ": " + e.what() + "; the islands took different steps while they should have shared every "
                "gradient (a bug: please report it with the run's config)");
  }
  return hash;
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

  // train.device = cuda: the step runs on GPU `rank` (modulo the devices); the host copies in
  // loop.model / loop.opt serve initialisation, DiLoCo's outer step and checkpoints.
  Loop loop(cfg, data.dir, w, W, opts.rank);
  loop.model.init_params(uint64_t(cfg.model.init_seed));
  const size_t n = loop.model.layout().total();
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
    expect_same(*g, who, "initial parameters (xxh3)", hash_floats(loop.model.params().data(), n));
    expect_same(*g, who, "step resumed from", resume ? resume_state.at("step").dump() : "none (a fresh start)");
  }
  loop.join_island(inner);  // the island's NCCL communicator, on the GPU with M > 1
  DilocoSync diloco(outer, loop.model.params().data(), n,
                    {.outer_lr = cfg.diloco.outer_lr,
                     .outer_momentum = cfg.diloco.outer_momentum,
                     .ring = {.codec = parse_codec(cfg.diloco.codec),
                              .chunk_bytes = size_t(cfg.diloco.chunk_kb) * 1024,
                              .timeout = timeout,
                              .error_feedback = cfg.diloco.error_feedback,
                              .compress = cfg.diloco.compress == "zstd"}},
                    model_fragments(loop.model.layout(), cfg.diloco.fragments), &inner);
  StreamingDiloco streaming(diloco, outer,
                            {.inner_steps = cfg.diloco.inner_steps,
                             .overlap_steps = cfg.diloco.overlap_steps,
                             .mixing = cfg.diloco.mixing});
  if (resume) restore_worker(opts.resume_from, resume_state, cfg, opts.island, w, loop, diloco);
  loop.to_device();  // the initial or restored parameters and moments (a no-op on the CPU)
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
    log_info(who + ": " + std::to_string(loop.model.layout().n_params()) + " parameters, data slice " +
             std::to_string(w) + " of " + std::to_string(W) + ", " + std::to_string(diloco.fragments()) +
             " fragment(s)" + (resume ? ", resumed at step " + std::to_string(loop.step) : ""));

  WorkerResult result;
  const int T = cfg.model.seq_len;
  const double inv_m = 1.0 / M, inv_n = 1.0 / N;
  // diloco.dp_warmup_steps: steps 1..dp_warmup are data parallel across every worker; DiLoCo
  // then starts from θ = the warm parameters and counts its inner steps from there.
  const int64_t dp_warmup = std::min(cfg.diloco.dp_warmup_steps, cfg.train.steps);
  const int64_t diloco_steps = cfg.train.steps - dp_warmup;
  const std::vector<size_t> shards = even_part_sizes(n, M);  // the warm start's gradient shards
  const auto [shard_lo, shard_hi] = even_part(n, opts.rank, M);
  double compute_s = 0, comm_s = 0, idle_s = 0, overlap_s = 0;
  bool checkpoint_due = false;
  float* params = loop.model.params().data();
  float* grads = loop.model.grads().data();
  while (loop.step < cfg.train.steps) {
    const double t0 = now_s();
    const int batch = batch_at(cfg.train, loop.tokens, T);
    const LossParts loss = loop.gradients(batch);
    const double t1 = now_s();
    compute_s += t1 - t0;
    if (M > 1 && loop.device) {  // on the GPU: NCCL's mean, in device memory
      loop.average_device_grads();
    } else if (M > 1) {  // synchronous data parallel inside the island: the mean gradient
      inner.allreduce_sum(grads, n);
      scale(grads, n, inv_m);
    }
    // The warm start: the islands' means averaged across islands, so every worker takes the
    // same step. Gloo's ring hands every rank the same sum, so the islands stay bit-identical.
    // Rank r averages the r-th M-th over its outer group, then the island shares the shards,
    // so the slow links carry each gradient element once per island.
    if (N > 1 && loop.step < dp_warmup) {
      loop.grads_to_host();
      outer.allreduce_sum(grads + shard_lo, shard_hi - shard_lo);
      scale(grads + shard_lo, shard_hi - shard_lo, inv_n);
      if (M > 1) inner.allgatherv(grads, shards);
      loop.grads_to_device();
    }
    const double t2 = now_s();
    comm_s += t2 - t1;
    if (!std::isfinite(loss.total()))
      throw Error(who + ": loss is " + std::to_string(loss.total()) + " at step " + std::to_string(loop.step + 1) +
                  "; fix: lower optim.lr or raise optim.warmup_steps");
    const double grad_norm = loop.clip_grads();  // clip_grad_norm(grads, n, ...) on the CPU
    const double lr = lr_at(cfg.optim, loop.step, cfg.train.steps);
    loop.optimizer_step(lr);  // loop.opt.step(params, grads, lr) on the CPU
    ++loop.step;
    loop.tokens += int64_t(batch) * T * W;
    const double t3 = now_s();
    compute_s += t3 - t2;
    nlohmann::json row = {{"step", loop.step}, {"tokens", loop.tokens}, {"loss", loss.ce}, {"aux_loss", loss.aux},
                          {"z_loss", loss.z}, {"lr", lr}, {"grad_norm", grad_norm}, {"batch_size", batch},
                          {"island", opts.island}, {"rank", opts.rank}};
    // The outer steps due after this step (dist/streaming.h): blocking, started, or finished.
    // On the GPU the outer step works on the host copy: down before any step that may read or
    // write θ (a fragment due, the last step, or an exchange in flight, which may finish here),
    // up after. after_step() touches θ at no other step.
    const int64_t inner_step = loop.step - dp_warmup;  // DiLoCo's step count, 0 at its start
    const bool warm_start_ends = inner_step == 0 && dp_warmup > 0;
    const bool theta_on_host =
        loop.device && (warm_start_ends || (inner_step > 0 && (inner_step >= diloco_steps || streaming.in_flight() ||
                                                               streaming.schedule().due(inner_step, diloco_steps) >= 0)));
    if (theta_on_host) loop.params_to_host();
    StreamStep st;
    if (warm_start_ends) {
      row["theta_hash"] = start_diloco(diloco, outer, who, params);
      row["outer_step"] = 0;
      if (w == 0) events->write({{"event", "diloco_start"}, {"step", loop.step}, {"theta_hash", row["theta_hash"]}});
    } else if (inner_step > 0) {
      st = streaming.after_step(inner_step, diloco_steps, params);
    }
    if (theta_on_host) loop.params_to_device();
    comm_s += st.comm_s;
    idle_s += st.idle_s;
    overlap_s += st.overlap_s;
    if (row.contains("theta_hash")) result.theta_hash = row["theta_hash"].get<std::string>();
    if (st.synced) {
      row["outer_step"] = st.synced->outer_step;
      row["fragment"] = st.synced->fragment;
      row["theta_hash"] = st.synced->theta_hash;
      result.theta_hash = st.synced->theta_hash;
    }
    const bool last = loop.step == cfg.train.steps;
    if (w == 0 && loop.val_data && cfg.train.eval_every > 0 && (loop.step % cfg.train.eval_every == 0 || last))
      row["val_loss"] = loop.validate();  // evaluate(loop.model, ...) on the CPU
    const double dt = now_s() - t0;
    row["comm_bytes"] = inner.stats().bytes_sent + outer.stats().bytes_sent;
    row["comm_s"] = comm_s;
    row["compute_s"] = compute_s;
    row["idle_s"] = idle_s;
    if (cfg.diloco.overlap_steps > 0) row["overlap_comm_s"] = overlap_s;
    row["tokens_per_s"] = double(batch) * T * W / dt;
    row["time_s"] = now_s() - t_start;
    if (loop.step == 1) result.first_loss = loss.ce;
    result.final_loss = loss.ce;
    if (loop.step % cfg.train.log_every == 0 || last || row.contains("theta_hash") || row.contains("val_loss"))
      rows.write(row);
    // A checkpoint waits until no exchange is in flight (the state then holds no half-done outer
    // step, and the gathers below may use the outer group); every worker takes part.
    checkpoint_due = checkpoint_due || (cfg.checkpoint.every > 0 && loop.step % cfg.checkpoint.every == 0) || last;
    if (checkpoint_due && !streaming.in_flight()) {
      loop.to_host();  // parameters and moments from the GPU (a no-op on the CPU)
      const std::string dir = save_worker(cfg, run_dir, opts.island, opts.rank, N, M, inner, outer, loop, diloco);
      if (w == 0) events->write({{"event", "checkpoint"}, {"step", loop.step}, {"dir", dir}});
      checkpoint_due = false;
    }
  }
  if (w == 0) events->write({{"event", "end"}, {"step", loop.step}});
  result.steps = loop.step;
  result.outer_steps = diloco.outer_step();
  if (result.theta_hash.empty()) result.theta_hash = diloco.theta_hash();
  return result;
}

}  // namespace atl
