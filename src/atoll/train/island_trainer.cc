#include "atoll/train/island_trainer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/core/timer.h"
#include "atoll/dist/diloco.h"
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
                      "train.device and data.dir may differ)");
  }
}

}  // namespace

std::string shared_config_toml(const Config& cfg) {
  Config c = cfg;
  const Config defaults;
  c.train.threads = defaults.train.threads;
  c.train.device = defaults.train.device;
  c.data.dir = defaults.data.dir;
  return config_to_toml(c);
}

WorkerResult run_worker(const Config& cfg, const WorkerOptions& opts) {
  if (cfg.train.precision != "fp32")
    throw ConfigError("train.precision = \"" + cfg.train.precision + "\" is not available in this build yet; fix: use fp32");
  if (cfg.diloco.fragments != 1 || cfg.diloco.overlap_steps != 0)
    throw ConfigError("diloco.fragments = " + std::to_string(cfg.diloco.fragments) + ", diloco.overlap_steps = " +
                      std::to_string(cfg.diloco.overlap_steps) +
                      ": streaming DiLoCo is not available yet; fix: use fragments = 1 and overlap_steps = 0");
  const int N = opts.islands, M = opts.workers_per_island, W = N * M;
  ATOLL_CHECK(N >= 1 && M >= 1 && opts.island >= 0 && opts.island < N && opts.rank >= 0 && opts.rank < M)
      << "island " << opts.island << " of " << N << ", rank " << opts.rank << " of " << M;
  const int w = opts.island * M + opts.rank;
  const std::string who = "island " + std::to_string(opts.island) + " rank " + std::to_string(opts.rank);
  const double t_start = now_s();
  const auto timeout = std::chrono::milliseconds(int64_t(cfg.fault.timeout_s * 1000));
  configure_threads(cfg.train.threads);
  const DatasetInfo data = resolve_dataset(cfg);
  const std::string run_dir = opts.run_dir.empty() ? default_run_dir() : opts.run_dir;
  // Without a launcher, worker 0 owns the run folder: checked before any peer can write to it.
  RunDir rd;
  rd.path = run_dir;
  if (w == 0 && opts.metrics_fd < 0) rd = inspect_run_dir(run_dir, cfg, false);

  Loop loop(cfg, data.dir, w, W);
  loop.model.init_params(uint64_t(cfg.model.init_seed));
  const size_t n = loop.model.layout().total();

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
    expect_same(*g, who, "config", shared_config_toml(cfg));
    expect_same(*g, who, "initial parameters (xxh3)", hash_floats(loop.model.params().data(), n));
  }
  DilocoSync diloco(outer, loop.model.params().data(), n,
                    {.inner_steps = cfg.diloco.inner_steps,
                     .outer_lr = cfg.diloco.outer_lr,
                     .outer_momentum = cfg.diloco.outer_momentum,
                     .ring = {.codec = parse_codec(cfg.diloco.codec),
                              .chunk_bytes = size_t(cfg.diloco.chunk_kb) * 1024,
                              .timeout = timeout,
                              .error_feedback = cfg.diloco.error_feedback}});
  if (w == 0 && opts.metrics_fd < 0) write_run_config(rd, cfg);
  std::filesystem::create_directories(run_dir);
  RowSink rows(opts.metrics_fd, run_dir + "/metrics.jsonl");
  std::unique_ptr<JsonlWriter> events;
  if (w == 0) events = std::make_unique<JsonlWriter>(run_dir + "/events.jsonl");
  if (!opts.quiet)
    log_info(who + ": " + std::to_string(loop.model.layout().n_params()) + " parameters, data slice " +
             std::to_string(w) + " of " + std::to_string(W));

  auto buffers = [&] {
    auto b = loop.buffers();
    b.push_back({"diloco_theta", diloco.theta().data()});
    b.push_back({"diloco_momentum", diloco.momentum().data()});
    return b;
  };
  auto save = [&] {
    nlohmann::json state = loop.state();
    state["outer_step"] = diloco.outer_step();
    state["islands"] = N;
    state["workers_per_island"] = M;
    const std::string dir = save_checkpoint({.run_dir = run_dir, .step = loop.step, .keep = cfg.checkpoint.keep}, cfg,
                                            loop.model.layout(), buffers(), state);
    events->write({{"event", "checkpoint"}, {"step", loop.step}, {"dir", dir}});
  };

  WorkerResult result;
  const int T = cfg.model.seq_len;
  const double inv_m = 1.0 / M;
  double compute_s = 0, comm_s = 0, idle_s = 0;
  float* params = loop.model.params().data();
  float* grads = loop.model.grads().data();
  while (loop.step < cfg.train.steps) {
    const double t0 = now_s();
    const int batch = batch_at(cfg.train, loop.tokens, T);
    const LossParts loss = loop.gradients(batch);
    const double t1 = now_s();
    compute_s += t1 - t0;
    if (M > 1) {  // synchronous data parallel inside the island: the mean gradient
      inner.allreduce_sum(grads, n);
      const float s = float(inv_m);
      for (size_t i = 0; i < n; ++i) grads[i] *= s;
    }
    const double t2 = now_s();
    comm_s += t2 - t1;
    if (!std::isfinite(loss.total()))
      throw Error(who + ": loss is " + std::to_string(loss.total()) + " at step " + std::to_string(loop.step + 1) +
                  "; fix: lower optim.lr or raise optim.warmup_steps");
    const double grad_norm = clip_grad_norm(grads, n, cfg.optim.grad_clip);
    const double lr = lr_at(cfg.optim, loop.step, cfg.train.steps);
    loop.opt.step(params, grads, lr);
    ++loop.step;
    loop.tokens += int64_t(batch) * T * W;
    const double t3 = now_s();
    compute_s += t3 - t2;
    nlohmann::json row = {{"step", loop.step}, {"tokens", loop.tokens}, {"loss", loss.ce}, {"aux_loss", loss.aux},
                          {"z_loss", loss.z}, {"lr", lr}, {"grad_norm", grad_norm}, {"batch_size", batch},
                          {"island", opts.island}, {"rank", opts.rank}};
    if (diloco.due(loop.step, cfg.train.steps)) {
      // Waiting for the slowest island is idle time; the exchange itself is communication.
      const double b0 = now_s();
      outer.barrier();
      const double b1 = now_s();
      const SyncResult s = diloco.sync(params);
      idle_s += b1 - b0;
      comm_s += s.seconds;
      row["outer_step"] = s.outer_step;
      row["theta_hash"] = s.theta_hash;
      result.theta_hash = s.theta_hash;
    }
    const bool last = loop.step == cfg.train.steps;
    if (w == 0 && loop.val_data && cfg.train.eval_every > 0 && (loop.step % cfg.train.eval_every == 0 || last))
      row["val_loss"] = evaluate(loop.model, *loop.val_data, cfg);
    const double dt = now_s() - t0;
    row["comm_bytes"] = inner.stats().bytes_sent + outer.stats().bytes_sent;
    row["comm_s"] = comm_s;
    row["compute_s"] = compute_s;
    row["idle_s"] = idle_s;
    row["tokens_per_s"] = double(batch) * T * W / dt;
    row["time_s"] = now_s() - t_start;
    if (loop.step == 1) result.first_loss = loss.ce;
    result.final_loss = loss.ce;
    if (loop.step % cfg.train.log_every == 0 || last || row.contains("theta_hash") || row.contains("val_loss"))
      rows.write(row);
    if (w == 0 && ((cfg.checkpoint.every > 0 && loop.step % cfg.checkpoint.every == 0) || last)) save();
  }
  if (w == 0) events->write({{"event", "end"}, {"step", loop.step}});
  result.steps = loop.step;
  result.outer_steps = diloco.outer_step();
  return result;
}

}  // namespace atl
