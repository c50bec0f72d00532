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
#include "atoll/optim/clip.h"
#include "atoll/optim/optimizer.h"
#include "atoll/optim/schedule.h"
#include "atoll/train/dataset.h"
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

namespace {

int micro_batch(const TrainConfig& t) { return t.micro_batch_size ? t.micro_batch_size : t.batch_size; }

// Mean cross-entropy over the first eval_batches micro-batches of the validation split.
double evaluate(Model<float>& model, DataLoader& val, const Config& cfg) {
  const int mb = micro_batch(cfg.train), T = cfg.model.seq_len;
  const int64_t windows = std::min<int64_t>(int64_t(cfg.train.eval_batches) * mb, val.n_windows());
  std::vector<int32_t> in(size_t(mb) * T), tg(size_t(mb) * T);
  val.reset();
  double sum = 0;
  for (int64_t done = 0; done < windows;) {
    const int b = int(std::min<int64_t>(mb, windows - done));
    val.next_batch(b, in.data(), tg.data());
    sum += model.forward(in.data(), tg.data(), b).ce * b;
    done += b;
  }
  return sum / double(windows);
}

struct Loop {
  const Config& cfg;
  Model<float> model;
  Optimizer opt;
  DataLoader train_data;
  std::unique_ptr<DataLoader> val_data;  // absent when the data has no validation split
  int64_t step = 0, tokens = 0;

  Loop(const Config& c, const std::string& data_dir)
      : cfg(c),
        model(c.model, micro_batch(c.train)),
        opt(c.optim, model.layout()),
        train_data(data_dir, "train", {.seq_len = c.model.seq_len, .seed = uint64_t(c.train.seed)}) {
    train_data.check_vocab(c.model.vocab_size);
    if (has_val_split(data_dir)) {
      val_data = std::make_unique<DataLoader>(data_dir, "val",
                                              LoaderOptions{.seq_len = c.model.seq_len, .shuffle = false, .prefetch = false});
      val_data->check_vocab(c.model.vocab_size);
    }
  }

  static bool has_val_split(const std::string& dir) {
    if (!fs::is_directory(dir)) return true;  // a single .bin file serves both
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind("val_", 0) == 0 && e.path().extension() == ".bin") return true;
    return false;
  }

  std::vector<CheckpointBuffer> buffers() {
    return {{"param", model.params().data()}, {"adam_m", opt.m().data()}, {"adam_v", opt.v().data()}};
  }
  nlohmann::json state() const {
    return {{"step", step}, {"tokens", tokens}, {"optimizer_step", opt.step_count()}, {"loader", train_data.cursor()}};
  }
  void restore(const nlohmann::json& s) {
    step = s.at("step").get<int64_t>();
    tokens = s.at("tokens").get<int64_t>();
    opt.set_step_count(s.at("optimizer_step").get<int64_t>());
    train_data.set_cursor(s.at("loader").get<Cursor>());
  }
};

}  // namespace

TrainResult train(const Config& cfg, const TrainOptions& opts) {
  if (cfg.train.precision != "fp32")
    throw ConfigError("train.precision = \"" + cfg.train.precision + "\" is not available in this build yet; fix: use fp32");
  if (cfg.train.device != "cpu")
    throw ConfigError("train.device = \"" + cfg.train.device + "\" is not available in this build; fix: use cpu");
  const double t_start = now_s();
  TrainResult result;
  const int threads = configure_threads(cfg.train.threads);
  const DatasetInfo data = resolve_dataset(cfg);
  RunDir rd = inspect_run_dir(opts.run_dir.empty() ? default_run_dir() : opts.run_dir, cfg, opts.resume);
  result.run_dir = rd.path;
  // Validate everything (data, vocabulary, the checkpoint) before the run folder is touched.
  Loop loop(cfg, data.dir);
  loop.model.init_params(uint64_t(cfg.model.init_seed));
  if (!rd.checkpoint.empty())
    loop.restore(load_checkpoint(rd.checkpoint, cfg.model, loop.model.layout(), loop.buffers()));
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
    events.write({{"event", "start"}, {"threads", threads}, {"params", loop.model.layout().n_params()}});
  }
  truncate_jsonl_after_step(rd.path + "/metrics.jsonl", loop.step);
  JsonlWriter metrics(rd.path + "/metrics.jsonl");
  if (!opts.quiet)
    log_info("run " + rd.path + ": " + std::to_string(loop.model.layout().n_params()) + " parameters, " +
             std::to_string(threads) + " threads, data " + data.dir);

  const int T = cfg.model.seq_len, mb = micro_batch(cfg.train);
  std::vector<int32_t> in(size_t(mb) * T), tg(size_t(mb) * T);
  Progress progress("step", cfg.train.steps);
  auto save = [&] {
    result.checkpoint = save_checkpoint({.run_dir = rd.path, .step = loop.step, .keep = cfg.checkpoint.keep}, cfg,
                                        loop.model.layout(), loop.buffers(), loop.state());
    events.write({{"event", "checkpoint"}, {"step", loop.step}, {"dir", result.checkpoint}});
  };
  double last_loss = 0;
  while (loop.step < cfg.train.steps) {
    const double t0 = now_s();
    const int batch = batch_at(cfg.train, loop.tokens, T);
    const int n_micro = batch / mb;
    loop.model.zero_grads();
    LossParts loss;
    for (int i = 0; i < n_micro; ++i) {
      loop.train_data.next_batch(mb, in.data(), tg.data());
      LossParts part = loop.model.forward_backward(in.data(), tg.data(), mb, 1.0 / n_micro);
      loss.ce += part.ce / n_micro, loss.aux += part.aux / n_micro, loss.z += part.z / n_micro;
    }
    if (!std::isfinite(loss.total()))
      throw Error("loss is " + std::to_string(loss.total()) + " at step " + std::to_string(loop.step + 1) +
                  "; fix: lower optim.lr or raise optim.warmup_steps (checkpoints so far are intact)");
    const double grad_norm = clip_grad_norm(loop.model.grads().data(), loop.model.grads().size(), cfg.optim.grad_clip);
    const double lr = lr_at(cfg.optim, loop.step, cfg.train.steps);
    loop.opt.step(loop.model.params().data(), loop.model.grads().data(), lr);
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
      result.final_val_loss = evaluate(loop.model, *loop.val_data, cfg);
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
