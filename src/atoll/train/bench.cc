#include "atoll/train/bench.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "atoll/core/errors.h"
#include "atoll/core/rng.h"
#include "atoll/core/timer.h"
#include "atoll/engine/engine.h"
#include "atoll/engine/memory_estimate.h"
#include "atoll/model/decoder.h"
#include "atoll/model/model.h"
#include "atoll/optim/schedule.h"
#include "atoll/train/trainer.h"

namespace atl {

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

namespace {

// Minimum, median and maximum of the timed steps' seconds (at least one).
struct StepStats {
  double min, median, max;
};
StepStats step_stats(std::vector<double> s) {
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  return {s.front(), n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]), s.back()};
}

// Synthetic next-token data: B random sequences of T+1 tokens, inputs [B,T] their first T
// tokens, targets [B,T] the next ones.
void random_batch(Rng& rng, int V, int B, int T, std::vector<int32_t>& in, std::vector<int32_t>& tg) {
  in.resize(size_t(B) * T), tg.resize(size_t(B) * T);
  std::vector<int32_t> tokens(size_t(B) * (T + 1));
  for (auto& t : tokens) t = int32_t(rng.below(V));
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) in[b * T + t] = tokens[b * (T + 1) + t], tg[b * T + t] = tokens[b * (T + 1) + t + 1];
}

// A step cannot do more than the device's peak: an MFU above 1 means the peak was measured while
// other work slowed it (a shared host), or the given peak is wrong. Said, not printed as real.
bool mfu_disturbed(double mfu) { return mfu > 1.0; }

}  // namespace

PeakRate mfu_peak(double given, const std::string& given_by, bool measure, const Engine& engine, Precision precision) {
  if (given > 0) return {given, given_by};
  return measure ? engine.matmul_peak(precision) : PeakRate{};
}

double mfu_of(const ModelConfig& m, double tokens_per_s, int devices, double peak_gflops) {
  return peak_gflops > 0 ? flops_per_token(m) * tokens_per_s * 1e-9 / (devices * peak_gflops) : 0.0;
}

// Full training steps on synthetic tokens through the engine train.device names: forward and
// backward over the micro-batches, then clipping and the optimizer (timed as "optimizer");
// the engine reports its own phases where it measures them (the CPU model's), and MFU is
// against the engine's matrix-multiply peak in train.precision's input type.
nlohmann::json run_bench(const Config& cfg, const BenchOptions& opts) {
  wants_gpu(cfg.train);  // cuda in a build without CUDA: a ConfigError that names the fix
  check_memory_fits(cfg);
  const Precision precision = parse_precision(cfg.train.precision);
  const int threads = configure_threads(cfg.train.threads);
  const ModelConfig& m = cfg.model;
  const int B = micro_batch(cfg.train), n_micro = cfg.train.batch_size / B, T = m.seq_len;
  std::unique_ptr<Engine> engine = make_engine(cfg);
  const bool cpu = engine->device_name() == "cpu";
  const PeakRate peak = mfu_peak(opts.peak_gflops, "given with --peak-gflops", opts.measure_peak, *engine, precision);
  engine->init_params(uint64_t(m.init_seed));
  engine->to_device(kParams);
  Rng rng(uint64_t(cfg.train.seed));
  std::vector<int32_t> in, tg;
  std::vector<double> step_s;
  double fb_s = 0, opt_s = 0, first_loss = 0, last_loss = 0;
  for (int s = 0; s < opts.warmup + opts.steps; ++s) {
    if (s == opts.warmup) engine->reset_phase_times(), fb_s = opt_s = 0;
    const double t0 = now_s();
    engine->zero_grads();
    for (int i = 0; i < n_micro; ++i) {
      random_batch(rng, m.vocab_size, B, T, in, tg);
      last_loss = engine->forward_backward(in.data(), tg.data(), B, 1.0 / n_micro).total();  // waits for it
    }
    if (s == 0) first_loss = last_loss;
    const double t1 = now_s();
    engine->clip_grads(cfg.optim.grad_clip);
    engine->optimizer_step(lr_at(cfg.optim, s, opts.warmup + opts.steps));
    engine->synchronize();
    fb_s += t1 - t0, opt_s += now_s() - t1;
    if (s >= opts.warmup) step_s.push_back(now_s() - t0);
  }
  const StepStats st = step_stats(step_s);
  const double tok = double(cfg.train.batch_size) * T;
  const double fpt = flops_per_token(m), gflops = fpt * tok / st.median * 1e-9;
  const double mfu = mfu_of(m, tok / st.median, 1, peak.gflops);
  const double per = 1.0 / opts.steps;
  double total_s = 0, model_s = 0;
  for (double x : step_s) total_s += x;
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& [name, seconds] : engine->phase_times()) phases[name] = seconds * per, model_s += seconds;
  if (phases.empty()) phases["forward_backward"] = fb_s * per;
  phases["optimizer"] = opt_s * per;
  if (cpu) phases["other"] = std::max(0.0, (total_s - model_s - opt_s) * per);
  nlohmann::json r = {{"device", engine->device_name()}, {"precision", cfg.train.precision},
                      {"batch_size", cfg.train.batch_size}, {"micro_batch_size", B}, {"seq_len", T},
                      {"optimizer", cfg.optim.name}, {"params", engine->layout().n_params()},
                      {"steps", opts.steps}, {"step_s_median", st.median}, {"step_s_min", st.min},
                      {"step_s_max", st.max}, {"tokens_per_s", tok / st.median}, {"flops_per_token", fpt},
                      {"gflops", gflops}, {"peak_gflops", peak.gflops}, {"peak_method", peak.method},
                      {"mfu", mfu}, {"mfu_disturbed", mfu_disturbed(mfu)}, {"peak_rss_mib", peak_rss_mib()},
                      {"first_loss", first_loss}, {"last_loss", last_loss}, {"phase_s", phases}};
  const KvCacheBytes kv = kv_cache_bytes(m);
  r["kv_cache_bytes_per_token"] = kv.per_token, r["kv_cache_bytes_per_sequence"] = kv.per_sequence;
  r["kv_cache_bytes_per_token_mha"] = mha_kv_cache_bytes_per_token(m);
  if (cpu) r["threads"] = threads;
  if (!cpu) r["device_mib"] = double(engine->device_bytes()) / 1048576.0;
  std::printf("atoll bench: on %s, %d threads, batch %d x %d tokens, %s, %s, %ld parameters\n",
              engine->device_name().c_str(), threads, cfg.train.batch_size, T, cfg.optim.name.c_str(),
              precision_name(precision), long(engine->layout().n_params()));
  std::printf("  step %.4f s median (min %.4f, max %.4f) | %.1f tokens/s | %.1f GFLOP/s | MFU %.1f%% of %.1f GFLOP/s (%s)\n",
              st.median, st.min, st.max, tok / st.median, gflops, 100 * mfu, peak.gflops, peak.method.c_str());
  if (mfu_disturbed(mfu))
    std::printf("  MFU above 100%%: a disturbed measurement, not a real utilisation (the peak was measured while other "
                "work slowed it, or the peak given is wrong); rerun on a quiet machine or give --peak-gflops\n");
  std::printf("  phase seconds per step:");
  for (auto& [k, v] : phases.items()) std::printf(" %s %.4f (%.0f%%)", k.c_str(), v.get<double>(), 100 * v.get<double>() / st.median);
  std::printf("\n  peak RSS %.0f MiB | decoding cache %.0f bytes per token (+%.0f per sequence; MHA at equal width "
              "%.0f)\n", peak_rss_mib(), kv.per_token, kv.per_sequence, mha_kv_cache_bytes_per_token(m));
  return r;
}

}  // namespace atl
