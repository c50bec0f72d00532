#include "atoll/train/bench.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "atoll/backend/cpu/gemm.h"
#include "atoll/backend/cpu/gemm_bf16.h"
#include "atoll/core/errors.h"
#include "atoll/core/rng.h"
#include "atoll/core/timer.h"
#include "atoll/model/model.h"
#include "atoll/optim/clip.h"
#include "atoll/optim/optimizer.h"
#include "atoll/optim/schedule.h"
#include "atoll/train/loop.h"
#include "atoll/train/trainer.h"
#if ATOLL_WITH_CUDA
#include "atoll/backend/cuda/device.h"
#include "atoll/model/device_model.h"
#include "atoll/optim/device_optimizer.h"
#endif

namespace atl {

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

PeakResult measure_matmul_peak(int n, int reps) {
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  Rng rng(1);
  for (auto& x : a) x = float(rng.uniform() - 0.5);
  for (auto& x : b) x = float(rng.uniform() - 0.5);
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {  // the first run warms caches and threads up
    const double t0 = now_s();
    gemm<float>(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (r > 0) best = std::min(best, now_s() - t0);
  }
  PeakResult p;
  p.gflops = 2.0 * n * n * n / best * 1e-9;
  p.method = "best of " + std::to_string(reps) + " fp32 oneDNN sgemm " + std::to_string(n) + "x" + std::to_string(n) +
             "x" + std::to_string(n);
  return p;
}

PeakResult measure_bf16_matmul_peak(int n, int reps) {
  std::vector<bf16> a(size_t(n) * n), b(size_t(n) * n);
  std::vector<float> c(size_t(n) * n);
  Rng rng(1);
  for (auto& x : a) x = float_to_bf16(float(rng.uniform() - 0.5));
  for (auto& x : b) x = float_to_bf16(float(rng.uniform() - 0.5));
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {  // the first run also builds the primitive
    const double t0 = now_s();
    gemm_bf16(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (r > 0) best = std::min(best, now_s() - t0);
  }
  PeakResult p;
  p.gflops = 2.0 * n * n * n / best * 1e-9;
  p.method = "best of " + std::to_string(reps) + " bf16 oneDNN matmul " + std::to_string(n) + "x" +
             std::to_string(n) + "x" + std::to_string(n);
  return p;
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

#if ATOLL_WITH_CUDA
// The same measurement with the step on the GPU (train.device = cuda): forward/backward on the
// device model, clip and optimizer on the device; MFU against a cuBLAS product of the
// train.precision's input type (fp32, or bf16 with fp32 accumulation).
nlohmann::json run_bench_gpu(const Config& cfg, const BenchOptions& opts) {
  const std::string device = gpu_in_use();
  const ModelConfig& m = cfg.model;
  const int B = micro_batch(cfg.train), n_micro = cfg.train.batch_size / B, T = m.seq_len;
  const Precision precision = parse_precision(cfg.train.precision);
  const bool bf16 = precision == Precision::kBf16;
  const double peak = opts.measure_peak ? gpu::measure_matmul_peak_gflops(4096, 5, bf16) : 0.0;
  Model<float> host(m, 1);  // initial parameters, drawn as on the CPU
  host.init_params(uint64_t(m.init_seed));
  gpu::DeviceModel model(m, B, {.precision = precision});
  model.upload_params(host.params().data());
  gpu::DeviceOptimizer opt(cfg.optim, model.layout());
  Rng rng(uint64_t(cfg.train.seed));
  std::vector<int32_t> in, tg;
  std::vector<double> step_s;
  double fb_s = 0, opt_s = 0, first_loss = 0, last_loss = 0;
  for (int s = 0; s < opts.warmup + opts.steps; ++s) {
    const double t0 = now_s();
    model.zero_grads();
    for (int i = 0; i < n_micro; ++i) {
      random_batch(rng, m.vocab_size, B, T, in, tg);
      last_loss = model.forward_backward(in.data(), tg.data(), B, 1.0 / n_micro).total();  // waits for the device
    }
    if (s == 0) first_loss = last_loss;
    const double t1 = now_s();
    opt.clip_grad_norm(model.grads(), cfg.optim.grad_clip);
    opt.step(model.params(), model.grads(), lr_at(cfg.optim, s, opts.warmup + opts.steps));
    gpu::synchronize();
    if (s < opts.warmup) continue;
    fb_s += t1 - t0, opt_s += now_s() - t1;
    step_s.push_back(now_s() - t0);
  }
  const StepStats st = step_stats(step_s);
  const double tok = double(cfg.train.batch_size) * T;
  const double fpt = flops_per_token(m), gflops = fpt * tok / st.median * 1e-9;
  const double per = 1.0 / opts.steps;
  const std::string peak_method = std::string("best of 5 ") +
                                  (bf16 ? "bf16 cuBLAS GemmEx (fp32 accumulation)" : "fp32 cuBLAS sgemm") +
                                  " 4096x4096x4096";
  nlohmann::json phases = {{"forward_backward", fb_s * per}, {"optimizer", opt_s * per}};
  nlohmann::json r = {{"device", device}, {"precision", cfg.train.precision},
                      {"batch_size", cfg.train.batch_size}, {"micro_batch_size", B}, {"seq_len", T},
                      {"optimizer", cfg.optim.name}, {"params", model.layout().n_params()},
                      {"device_mib", model.device_bytes() / 1048576.0}, {"steps", opts.steps},
                      {"step_s_median", st.median}, {"step_s_min", st.min}, {"step_s_max", st.max},
                      {"tokens_per_s", tok / st.median}, {"flops_per_token", fpt}, {"gflops", gflops},
                      {"peak_gflops", peak}, {"peak_method", peak_method},
                      {"mfu", peak > 0 ? gflops / peak : 0.0}, {"peak_rss_mib", peak_rss_mib()},
                      {"first_loss", first_loss}, {"last_loss", last_loss}, {"phase_s", phases}};
  std::printf("atoll bench: on %s, batch %d x %d tokens, %s, %s, %ld parameters (%.0f MiB on the device)\n",
              device.c_str(), cfg.train.batch_size, T, cfg.optim.name.c_str(), precision_name(precision),
              long(model.layout().n_params()),
              r["device_mib"].get<double>());
  std::printf("  step %.4f s median (min %.4f, max %.4f) | %.1f tokens/s | %.1f GFLOP/s | MFU %.1f%% of %.1f GFLOP/s\n",
              st.median, st.min, st.max, tok / st.median, gflops, 100 * r["mfu"].get<double>(), peak);
  std::printf("  phase seconds per step: forward_backward %.4f, optimizer %.4f\n", fb_s * per, opt_s * per);
  return r;
}
#endif

}  // namespace

nlohmann::json run_bench(const Config& cfg, const BenchOptions& opts) {
#if ATOLL_WITH_CUDA
  if (wants_gpu(cfg.train)) return run_bench_gpu(cfg, opts);
#else
  wants_gpu(cfg.train);  // cuda in a build without CUDA: a ConfigError that names the fix
#endif
  const Precision precision = parse_precision(cfg.train.precision);
  const int threads = configure_threads(cfg.train.threads);
  const ModelConfig& m = cfg.model;
  const int B = cfg.train.micro_batch_size ? cfg.train.micro_batch_size : cfg.train.batch_size;
  const int n_micro = cfg.train.batch_size / B, T = m.seq_len;
  PeakResult peak;
  if (opts.measure_peak)
    peak = precision == Precision::kBf16 ? measure_bf16_matmul_peak() : measure_matmul_peak();

  Model<float> model(m, B, precision);
  model.init_params(uint64_t(m.init_seed));
  Optimizer opt(cfg.optim, model.layout());
  opt.set_muon_bf16(precision == Precision::kBf16);
  Rng rng(uint64_t(cfg.train.seed));
  std::vector<int32_t> in, tg;
  std::vector<double> step_s;
  double opt_s = 0, first_loss = 0, last_loss = 0;
  for (int s = 0; s < opts.warmup + opts.steps; ++s) {
    if (s == opts.warmup) model.phase_times() = {}, opt_s = 0;
    const double t0 = now_s();
    model.zero_grads();
    for (int i = 0; i < n_micro; ++i) {
      random_batch(rng, m.vocab_size, B, T, in, tg);
      last_loss = model.forward_backward(in.data(), tg.data(), B, 1.0 / n_micro).total();
    }
    if (s == 0) first_loss = last_loss;
    const double t1 = now_s();
    clip_grad_norm(model.grads().data(), model.grads().size(), cfg.optim.grad_clip);
    opt.step(model.params().data(), model.grads().data(), lr_at(cfg.optim, s, opts.warmup + opts.steps));
    opt_s += now_s() - t1;
    if (s >= opts.warmup) step_s.push_back(now_s() - t0);
  }
  const StepStats st = step_stats(step_s);
  const double tok = double(cfg.train.batch_size) * T;
  const double fpt = flops_per_token(m), gflops = fpt * tok / st.median * 1e-9;
  const PhaseTimes& ph = model.phase_times();
  const double per = 1.0 / opts.steps;
  double total_s = 0;
  for (double x : step_s) total_s += x;
  nlohmann::json phases = {{"attention", ph.attention * per},   {"router_dispatch", ph.router_dispatch * per},
                           {"experts", ph.experts * per},       {"head_loss", ph.head_loss * per},
                           {"embedding", ph.embed * per},       {"weights_bf16", ph.weights_bf16 * per},
                           {"optimizer", opt_s * per},
                           {"other", std::max(0.0, (total_s - ph.total() - opt_s) * per)}};
  nlohmann::json r = {{"precision", cfg.train.precision}, {"threads", threads},
                      {"batch_size", cfg.train.batch_size}, {"micro_batch_size", B}, {"seq_len", T},
                      {"optimizer", cfg.optim.name}, {"params", model.layout().n_params()},
                      {"steps", opts.steps}, {"step_s_median", st.median}, {"step_s_min", st.min},
                      {"step_s_max", st.max}, {"tokens_per_s", tok / st.median}, {"flops_per_token", fpt},
                      {"gflops", gflops}, {"peak_gflops", peak.gflops}, {"peak_method", peak.method},
                      {"mfu", peak.gflops > 0 ? gflops / peak.gflops : 0.0}, {"peak_rss_mib", peak_rss_mib()},
                      {"first_loss", first_loss}, {"last_loss", last_loss}, {"phase_s", phases}};
  std::printf("atoll bench: %d threads, batch %d x %d tokens, %s, %s, %ld parameters\n", threads,
              cfg.train.batch_size, T, cfg.optim.name.c_str(), precision_name(precision),
              long(model.layout().n_params()));
  std::printf("  step %.3f s median (min %.3f, max %.3f) | %.1f tokens/s | %.1f GFLOP/s | MFU %.1f%% of %.1f GFLOP/s (%s)\n",
              st.median, st.min, st.max, tok / st.median, gflops, 100 * r["mfu"].get<double>(), peak.gflops,
              peak.method.c_str());
  std::printf("  phase seconds per step:");
  for (auto& [k, v] : phases.items()) std::printf(" %s %.3f (%.0f%%)", k.c_str(), v.get<double>(), 100 * v.get<double>() / st.median);
  std::printf("\n  peak RSS %.0f MiB\n", peak_rss_mib());
  return r;
}

}  // namespace atl
