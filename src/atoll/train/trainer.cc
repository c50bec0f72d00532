#include "atoll/train/trainer.h"

#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "atoll/backend/cpu/gemm.h"
#include "atoll/core/log.h"
#include "atoll/core/timer.h"
#include "atoll/train/dataset.h"
#include "atoll/train/driver.h"
#include "atoll/train/loop.h"
#include "atoll/train/metrics.h"
#include "atoll/train/progress.h"
#include "atoll/train/run_dir.h"
#include "atoll/train/state_checkpoint.h"

namespace atl {
namespace fs = std::filesystem;

int configure_threads(int threads) {
  const int n = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(n);
  set_blas_threads(n);
  return n;
}

TrainResult train(const Config& cfg, const TrainOptions& opts) {
  parse_precision(cfg.train.precision);  // fp32 | bf16 (model.h); anything else is a ConfigError
  wants_gpu(cfg.train);                   // cuda without a CUDA build is a ConfigError (engine.h)
  const double t_start = now_s();
  TrainResult result;
  const int threads = configure_threads(cfg.train.threads);
  const DatasetInfo data = resolve_dataset(cfg);
  RunDir rd = inspect_run_dir(opts.run_dir.empty() ? default_run_dir() : opts.run_dir, cfg, opts.resume);
  result.run_dir = rd.path;
  // Validate everything (data, vocabulary, the checkpoint) before the run folder is touched.
  Loop loop(cfg, data.dir);
  Engine& engine = *loop.engine;
  engine.init_params(uint64_t(cfg.model.init_seed));
  TrainingState state{.loop = loop};  // one island of one worker, without DiLoCo
  if (!rd.checkpoint.empty()) {
    const nlohmann::json manifest = read_training_manifest(rd.checkpoint);
    check_resume(manifest, rd.checkpoint, cfg, 1, 1, /*diloco=*/false);
    restore_training_state(rd.checkpoint, manifest, cfg, state, {});
  }
  engine.to_device(kAllState);
  write_run_config(rd, cfg);
  if (!data.tokenizer_path.empty()) {
    fs::copy_file(data.tokenizer_path, rd.path + "/tokenizer.model", fs::copy_options::overwrite_existing);
    result.tokenizer_path = rd.path + "/tokenizer.model";
  }
  JsonlWriter events(rd.path + "/events.jsonl");
  if (!rd.checkpoint.empty()) {
    events.write(event_row("resume", {{"step", loop.step}, {"checkpoint", rd.checkpoint}}));
    if (!opts.quiet) log_info("resumed " + rd.checkpoint + " at step " + std::to_string(loop.step));
  } else {
    events.write(event_row("start", {{"threads", threads}, {"params", engine.layout().n_params()},
                                     {"device", engine.device_name()}}));
  }
  truncate_jsonl_after_step(rd.path + "/metrics.jsonl", loop.step);
  JsonlWriter metrics(rd.path + "/metrics.jsonl");
  if (!opts.quiet)
    log_info("run " + rd.path + ": " + std::to_string(engine.layout().n_params()) + " parameters, " +
             std::to_string(threads) + " threads, data " + data.dir + ", on " + engine.device_name());

  Progress progress("step", cfg.train.steps);
  StepHooks alone;  // one island of one worker: nothing to add to the step
  const DriverResult r = run_steps(
      loop, alone,
      {.progress = opts.quiet ? nullptr : &progress,
       .write_row = [&](const nlohmann::json& row) { metrics.write(row); },
       .save =
           [&] {
             engine.to_host(kAllState);
             return save_training_state(cfg, rd.path, state, {});
           },
       .events = &events,
       .stop_after = opts.stop_after,
       .t_start = t_start});
  events.write(event_row("end", {{"step", loop.step}}));
  result.checkpoint = r.checkpoint;
  result.steps = loop.step;
  result.tokens = loop.tokens;
  result.first_loss = r.first_loss;
  result.final_loss = r.final_loss;
  result.final_val_loss = r.final_val_loss;
  result.seconds = now_s() - t_start;
  return result;
}

}  // namespace atl
