// The CPU engine (engine.h): the step on Model<float> and Optimizer in host memory, so host()
// is the working state and the transfers do nothing. Products through the BLAS (fp32) or
// oneDNN (bf16); OpenMP across the cores (train/trainer.h configure_threads).
#pragma once

#include "atoll/engine/engine.h"

namespace atl {

class CpuEngine final : public Engine {
 public:
  explicit CpuEngine(const Config& cfg, const EngineOptions& opts = {});

  std::string device_name() const override { return "cpu"; }
  void zero_grads() override { host_model_.zero_grads(); }
  void set_sequence(int seq_len, double rope_theta, int micro_batch) override {
    host_model_.set_sequence(seq_len, rope_theta, micro_batch);
  }
  std::vector<double> topk_choice_counts() const override { return host_model_.topk_choice_counts(); }
  void set_context_parallel(Collective* group) override { host_model_.set_context_parallel(group); }
  LossParts forward_backward(const int32_t* inputs, const int32_t* targets, int B, double loss_scale) override;
  LossParts forward(const int32_t* inputs, const int32_t* targets, int B, float* position_losses = nullptr) override;
  double clip_grads(double max_norm) override;
  void optimizer_step(double lr) override;
  int64_t optimizer_steps() const override { return host_opt_.step_count(); }
  void set_optimizer_steps(int64_t t) override { host_opt_.set_step_count(t); }
  void to_host(unsigned) override {}
  void to_device(unsigned) override {}
  void grad_rows_to_host(const std::vector<const ParamEntry*>&) override {}

  PeakRate matmul_peak(Precision precision) const override;
  void reset_phase_times() override;
  std::vector<std::pair<std::string, double>> phase_times() override;
};

// Best of `reps` fp32 BLAS products of size n×n×n on the configured threads.
PeakRate measure_matmul_peak(int n = 2048, int reps = 5);
// Best of `reps` bf16 oneDNN products (bf16 inputs, fp32 output, gemm_bf16.h) of n×n×n: the
// peak MFU is measured against when train.precision = bf16.
PeakRate measure_bf16_matmul_peak(int n = 2048, int reps = 5);

}  // namespace atl
