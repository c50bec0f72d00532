#include "atoll/train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "atoll/backend/cpu/gemm.h"
#include "atoll/config/context_parallel.h"
#include "atoll/core/file_writer.h"
#include "atoll/core/log.h"
#include "atoll/core/timer.h"
#include "atoll/engine/memory_estimate.h"
#include "atoll/model/layout.h"
#include "atoll/train/bench.h"
#include "atoll/train/dataset.h"
#include "atoll/train/driver.h"
#include "atoll/train/init_weights.h"
#include "atoll/train/loop.h"
#include "atoll/train/metrics.h"
#include "atoll/train/metrics_log.h"
#include "atoll/train/report.h"
#include "atoll/train/progress.h"
#include "atoll/train/run_dir.h"
#include "atoll/train/state_checkpoint.h"
#include "atoll/train/stop_signals.h"

namespace atl {
namespace fs = std::filesystem;

int configure_threads(int threads) {
  const int n = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(n);
  set_blas_threads(n);
  return n;
}

std::string describe_run(const Config& cfg, const std::string& run_dir) {
  const ModelConfig& m = cfg.model;
  const double n = double(ParamLayout::build(m).n_params());
  char size[32], line[512];
  if (n >= 1e9) std::snprintf(size, sizeof size, "%.2fB", n / 1e9);
  else if (n >= 1e6) std::snprintf(size, sizeof size, "%.1fM", n / 1e6);
  else std::snprintf(size, sizeof size, "%.1fk", n / 1e3);
  std::snprintf(line, sizeof line,
                "%s-parameter %s (L %d, C %d, E %d top-%d, V %d, T %d), %s lr %g %s, %ld steps x %d sequences, %s on "
                "%s, run %s",
                size, m.n_experts > 1 ? "MoE" : "dense model", m.n_layers, m.dim, m.n_experts, m.top_k, m.vocab_size,
                m.seq_len, cfg.optim.name.c_str(), cfg.optim.lr, cfg.optim.schedule.c_str(), long(cfg.train.steps),
                cfg.train.batch_size, cfg.train.precision.c_str(), cfg.train.device.c_str(), run_dir.c_str());
  return line;
}

namespace {

// summary.txt: the run's figures and the checkpoint it ended with. A resumed run's speed and
// first loss are this process's: from `start_step` (`start_tokens` then) on.
std::string summarize(const TrainResult& r, int64_t start_step, int64_t start_tokens) {
  char text[1024], done[160];
  const double speed = double(r.tokens - start_tokens) / std::max(r.seconds, 1e-9);
  if (start_step == 0)
    std::snprintf(done, sizeof done, " in %.1f s (%.0f tokens/s)", r.seconds, speed);
  else
    std::snprintf(done, sizeof done, "; resumed at step %ld: %ld steps in %.1f s (%.0f tokens/s)", long(start_step),
                  long(r.steps - start_step), r.seconds, speed);
  std::snprintf(text, sizeof text,
                "run %s: %ld steps, %ld tokens%s; train loss %.4f -> %.4f%s\n"
                "%s %s\n",
                r.run_dir.c_str(), long(r.steps), long(r.tokens), done, r.first_loss, r.final_loss,
                r.final_val_loss >= 0 ? (", validation loss " + std::to_string(r.final_val_loss).substr(0, 6)).c_str() : "",
                r.stopped_by ? ("stopped by signal " + std::to_string(r.stopped_by) + "; checkpoint").c_str()
                             : "final checkpoint",
                r.checkpoint.c_str());
  return text;
}

}  // namespace

TrainResult train(const Config& cfg, const TrainOptions& opts) {
  parse_precision(cfg.train.precision);  // fp32 | bf16 (model.h); anything else is a ConfigError
  wants_gpu(cfg.train);                   // cuda without a CUDA build is a ConfigError (engine.h)
  check_context_parallel(cfg, 1);         // one worker: train.context_parallel = 1 (launch splits sequences)
  check_memory_fits(cfg);                 // before the data is prepared or anything allocated
  const double t_start = now_s();
  TrainResult result;
  // Before any thread starts, so that every thread of the run leaves the signals to it.
  std::unique_ptr<StopSignals> signals;
  if (opts.stop_on_signal) signals = std::make_unique<StopSignals>(cfg.checkpoint.grace_s);
  // The folder first: a refused run directory costs no data preparation, and the lock is ours
  // before anything in it is written.
  RunDir rd = open_run_dir(opts.run_dir.empty() ? default_run_dir() : opts.run_dir, cfg,
                           {.resume = opts.resume, .allow_config_change = opts.allow_config_change,
                            .verify_checkpoint = false});  // verified below as it is read, once
  result.run_dir = rd.path;
  if (signals) signals->set_run_dir(rd.path);
  const int threads = configure_threads(cfg.train.threads);
  const DatasetInfo data = resolve_dataset(cfg);
  std::vector<float> imported;  // --init-from's weights, read and checked before the folder is written
  nlohmann::json init_event;
  if (!opts.init_from.empty()) {
    if (!rd.checkpoint.empty())
      throw RunDirConflict(rd.path + " already has checkpoints; --init-from starts a new run only (fix: another --run-dir)");
    imported.assign(ParamLayout::build(cfg.model).total(), 0.0f);
    init_event = init_from_hf(opts.init_from, cfg, data, imported.data());
  }
  // Validate everything (data, vocabulary, the checkpoint) before the run folder is touched.
  Loop loop(cfg, data.dir);
  Engine& engine = *loop.engine;
  engine.init_params(uint64_t(cfg.model.init_seed));
  if (!imported.empty()) std::copy(imported.begin(), imported.end(), engine.host().params);
  TrainingState state{.loop = loop};  // one island of one worker, without DiLoCo
  resume_from_intact(rd, [&](const std::string& dir) {  // the newest checkpoint that reads back intact
    const nlohmann::json manifest = read_training_manifest(dir);
    check_resume(manifest, dir, cfg, 1, 1, /*diloco=*/false);
    restore_training_state(dir, manifest, cfg, state, {});
  });
  engine.to_device(kAllState);
  begin_run(rd, cfg);
  if (!data.tokenizer_path.empty()) {
    std::error_code ec;
    fs::copy_file(data.tokenizer_path, rd.path + "/tokenizer.model", fs::copy_options::overwrite_existing, ec);
    if (ec) throw_io_error("copy " + data.tokenizer_path + " to", rd.path + "/tokenizer.model", ec.value());
    result.tokenizer_path = rd.path + "/tokenizer.model";
  }
  JsonlWriter events(rd.path + "/events.jsonl");
  record_resume(events, rd, loop.step);
  loop.on_data_phase = [&events](const nlohmann::json& fields) { events.write(event_row("data_phase", fields)); };
  if (!rd.checkpoint.empty()) {
    if (!opts.quiet) log_info("resumed " + rd.checkpoint + " at step " + std::to_string(loop.step));
  } else {
    events.write(event_row("start", {{"threads", threads}, {"params", engine.layout().n_params()},
                                     {"device", engine.device_name()}}));
    if (!init_event.is_null()) events.write(event_row("init_from", init_event));
  }
  truncate_jsonl_after_step(rd.path + "/metrics.jsonl", loop.step);
  // MFU in the rows against train.peak_gflops, or the engine's measured peak (bench.h).
  const PeakRate peak = mfu_peak(cfg.train.peak_gflops, "train.peak_gflops", cfg.train.peak_gflops < 0, engine,
                                 parse_precision(cfg.train.precision));
  if (peak.gflops > 0 && !opts.quiet)
    log_info("mfu in metrics.jsonl against " + std::to_string(peak.gflops) + " GFLOP/s (" + peak.method + ")");
  MetricsLog metrics(rd.path);
  metrics.on_eval = [&rd] { write_run_report(rd.path); };
  if (!opts.quiet)
    log_info("run " + rd.path + ": " + std::to_string(engine.layout().n_params()) + " parameters, " +
             std::to_string(threads) + " threads, data " + data.dir + ", on " + engine.device_name());

  const int64_t start_step = loop.step, start_tokens = loop.tokens;
  Progress progress("step", cfg.train.steps, start_step);
  StepHooks alone;  // one island of one worker: nothing to add to the step
  Checkpointer checkpointer(cfg, rd.path, state,
                            {.token = uint64_t(::getpid()), .on_commit = [&](const std::string& dir, int64_t step) {
                               events.write(event_row("checkpoint", {{"step", step}, {"dir", dir}}));
                             }});
  const DriverResult r = run_steps(
      loop, alone,
      {.peak_gflops = peak.gflops,
       .progress = opts.quiet ? nullptr : &progress,
       .write_row = [&](const nlohmann::json& row) { metrics.write(row); },
       .save = [&] { return checkpointer.save({}); },
       .finish_saves = [&] { return checkpointer.finish(); },
       .fence = [&] { return checkpointer.fence(); },
       .stop_after = opts.stop_after,
       .t_start = t_start,
       .stop_requested = [&] { return signals && signals->signal() != 0; }});
  result.stopped_by = r.stopped ? signals->signal() : 0;
  if (r.stopped)
    events.write(event_row("interrupted", {{"signal", result.stopped_by}, {"step", loop.step}, {"checkpoint", r.checkpoint}}));
  else
    events.write(event_row("end", {{"step", loop.step}}));
  result.checkpoint = r.checkpoint;
  result.steps = loop.step;
  result.tokens = loop.tokens;
  result.first_loss = r.first_loss;
  result.final_loss = r.final_loss;
  result.final_val_loss = r.final_val_loss;
  result.seconds = now_s() - t_start;
  result.summary = summarize(result, start_step, start_tokens);
  std::ofstream(rd.path + "/summary.txt") << result.summary;
  write_run_report(rd.path);
  return result;
}

}  // namespace atl
