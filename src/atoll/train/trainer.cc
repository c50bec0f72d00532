#include "atoll/train/trainer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <memory>
#include <thread>

#include "atoll/backend/cpu/gemm.h"
#include "atoll/ckpt/checkpoint.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/core/timer.h"
#include "atoll/data/loader.h"
#include "atoll/model/model.h"
#include "atoll/optim/optimizer.h"
#include "atoll/optim/schedule.h"
#include "atoll/train/dataset.h"
#include "atoll/train/loop.h"
#include "atoll/train/metrics.h"
#include "atoll/train/progress.h"
#include "atoll/train/run_dir.h"

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
  wants_gpu(cfg.train);                   // cuda without a CUDA build is a ConfigError (loop.h)
  const double t_start = now_s();
  TrainResult result;
  const int threads = configure_threads(cfg.train.threads);
  const DatasetInfo data = resolve_dataset(cfg);
  RunDir rd = inspect_run_dir(opts.run_dir.empty() ? default_run_dir() : opts.run_dir, cfg, opts.resume);
  result.run_dir = rd.path;
  // Validate everything (data, vocabulary, the checkpoint) before the run folder is touched.
  Loop loop(cfg, data.dir, 0, 1);
  loop.model.init_params(uint64_t(cfg.model.init_seed));
  if (!rd.checkpoint.empty())
    loop.restore(load_checkpoint(rd.checkpoint, cfg.model, loop.model.layout(), loop.buffers()));
  loop.to_device();
  write_run_config(rd, cfg);
  if (!data.tokenizer_path.empty()) {
    fs::copy_file(data.tokenizer_path, rd.path + "/tokenizer.model", fs::copy_options::overwrite_existing);
    result.tokenizer_path = rd.path + "/tokenizer.model";
  }
  JsonlWriter events(rd.path + "/events.jsonl");
  if (!rd.checkpoint.empty()) {
    events.write({{"event", "resume"}, {"step", loop.step}, {"checkpoint", rd.checkpoint}});
    if (!opts.quiet) log_info("resumed " + rd.checkpoint + " at step " + std::to_string(loop.step));
  } else {
    events.write({{"event", "start"}, {"threads", threads}, {"params", loop.model.layout().n_params()},
                  {"device", loop.device_name()}});
  }
  truncate_jsonl_after_step(rd.path + "/metrics.jsonl", loop.step);
  JsonlWriter metrics(rd.path + "/metrics.jsonl");
  if (!opts.quiet)
    log_info("run " + rd.path + ": " + std::to_string(loop.model.layout().n_params()) + " parameters, " +
             std::to_string(threads) + " threads, data " + data.dir + ", on " + loop.device_name());

  const int T = cfg.model.seq_len;
  Progress progress("step", cfg.train.steps);
  auto save = [&] {
    loop.to_host();
    result.checkpoint = save_checkpoint({.run_dir = rd.path, .step = loop.step, .keep = cfg.checkpoint.keep}, cfg,
                                        loop.model.layout(), loop.buffers(), loop.state());
    events.write({{"event", "checkpoint"}, {"step", loop.step}, {"dir", result.checkpoint}});
  };
  double last_loss = 0;
  while (loop.step < cfg.train.steps) {
    const double t0 = now_s();
    const int batch = batch_at(cfg.train, loop.tokens, T);
    const LossParts loss = loop.gradients(batch);
    if (!std::isfinite(loss.total()))
      throw Error("loss is " + std::to_string(loss.total()) + " at step " + std::to_string(loop.step + 1) +
                  "; fix: lower optim.lr or raise optim.warmup_steps (checkpoints so far are intact)");
    const double grad_norm = loop.clip_grads();
    const double lr = lr_at(cfg.optim, loop.step, cfg.train.steps);
    loop.optimizer_step(lr);
    ++loop.step;
    loop.tokens += int64_t(batch) * T;
    const double dt = now_s() - t0;
    if (loop.step == 1 || result.first_loss == 0) result.first_loss = loss.ce;
    last_loss = loss.ce;
    nlohmann::json row = {{"step", loop.step}, {"tokens", loop.tokens}, {"loss", loss.ce}, {"aux_loss", loss.aux},
                          {"z_loss", loss.z}, {"lr", lr}, {"grad_norm", grad_norm}, {"batch_size", batch},
                          {"tokens_per_s", batch * T / dt}, {"time_s", now_s() - t_start}};
    const bool last = loop.step == cfg.train.steps;
    if (loop.val_data && cfg.train.eval_every > 0 && (loop.step % cfg.train.eval_every == 0 || last)) {
      result.final_val_loss = loop.validate();
      row["val_loss"] = result.final_val_loss;
      if (!opts.quiet) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "step %ld: val_loss %.4f", long(loop.step), result.final_val_loss);
        progress.note(buf);
      }
    }
    if (loop.step % cfg.train.log_every == 0 || last || row.contains("val_loss")) metrics.write(row);
    if (!opts.quiet) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "loss %.4f | lr %.2e | %.0f tok/s", loss.ce, lr, batch * T / dt);
      progress.update(loop.step, buf);
    }
    if ((cfg.checkpoint.every > 0 && loop.step % cfg.checkpoint.every == 0) || last) save();
    if (opts.stop_after > 0 && loop.step >= opts.stop_after && !last) break;
  }
  progress.finish();
  if (result.checkpoint.empty()) save();
  events.write({{"event", "end"}, {"step", loop.step}});
  result.steps = loop.step;
  result.tokens = loop.tokens;
  result.final_loss = last_loss;
  result.seconds = now_s() - t_start;
  return result;
}

}  // namespace atl
