// The engine: what runs one training step, wherever it runs (DESIGN.md "engine"). The driver
// (train/driver.h) talks to this interface only; the CPU engine (cpu_engine.h) and the CUDA
// engine (cuda_engine.cc, CUDA builds) implement it over model/ and optim/.
//
// Ownership and placement. The engine owns the model's parameters and gradients and the
// optimizer's state (moments and step count), each one flat fp32 buffer laid out by layout()
// (model/layout.h). The working copies live where the step runs: host memory for the CPU
// engine, device memory for the CUDA engine. Every engine also holds host copies of the same
// shape (host()), through which the rest of the program sees the state: initialisation,
// checkpoints and resume, DiLoCo's outer step on the host, the warm start's gradient mean over
// Gloo, hashing. On the CPU the host copies ARE the working copies and the transfers below do
// nothing; on the GPU they are copies, exchanged only when asked (to_host, to_device).
//
// A step, in order:
//   zero_grads(); forward_backward(micro-batch i, loss_scale = 1/n) for i < n   // grads: the batch mean
//   [in-island gradient mean: island_grad_mean(), or Gloo on host().grads between
//    to_host(kGrads) and to_device(kGrads)]
//   clip_grads(optim.grad_clip); optimizer_step(lr)
// The engine takes token batches ([B, T] inputs and targets in host memory); it reads no data.
//
// Synchronous: forward_backward and forward return the loss (so they wait for the device),
// clip_grads returns the norm (waits), to_host and to_device return with the copy done.
// optimizer_step and zero_grads may run asynchronously on the device; any later call that
// reads back (a loss, a norm, a copy) orders after them. synchronize() waits for all of it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/model/layout.h"
#include "atoll/model/model.h"
#include "atoll/optim/optimizer.h"
#include "atoll/optim/zero_shard.h"

namespace atl {

// Sequences per forward/backward: train.micro_batch_size, or train.batch_size when it is 0.
int micro_batch(const TrainConfig& t);

// Whether train.device asks for the GPU ("cuda"). ConfigError, naming the key and the fix, for
// cuda in a build without CUDA. train.precision = bf16 works on both (bf16 products, fp32
// master weights); on the GPU Muon's Newton-Schulz stays fp32.
bool wants_gpu(const TrainConfig& t);

// Island workers with train.device = cuda and more than one worker per island average
// gradients with NCCL: ConfigError, with the fix, in a build without it. Nothing to check on
// the CPU or with one worker per island.
void check_island_device(const TrainConfig& t, int workers_per_island);

// The parts of the state that move between host and device (bit flags).
enum StatePart : unsigned {
  kParams = 1u,
  kGrads = 2u,
  kMoments = 4u,  // both moments and the optimizer's step count
  kAllState = kParams | kMoments,  // what a checkpoint holds
};

// Host memory, [layout().total()] floats each (see above).
struct HostBuffers {
  float* params = nullptr;
  float* grads = nullptr;
  float* m = nullptr;  // AdamW's first moment; Muon's momentum for hidden matrices
  float* v = nullptr;  // AdamW's second moment
};

// The moments a ZeRO-1 rank holds (optim/zero_shard.h): m[i] and v[i] are element shard.lo + i
// of the layout. An unsharded engine's is the whole layout (m and v are host().m and v).
struct MomentShard {
  ZeroShard shard;
  float* m = nullptr;
  float* v = nullptr;
};

// A ZeRO-1 rank's side of its island, set by the island worker (train/island_trainer.cc): the
// island's sum of one double (the gradient norm's squares, one per shard), and the all-gather
// of the parameters over the shards (sizes in rank order, ProcessGroup::allgatherv).
struct ZeroLink {
  std::function<double(double)> sum{};
  std::function<void(float*, const std::vector<size_t>&)> allgatherv{};
};

struct EngineOptions {
  // GPU index (modulo the device count) for train.device = cuda, e.g. an island worker's rank;
  // -1: the current GPU.
  int device_index = -1;
  // This worker's rank in its island and the island's size: with optim.zero1 and more than one
  // worker, the optimizer holds and steps the rank's shard only (optim/zero_shard.h).
  int island_rank = 0, island_size = 1;
};

// The island's side of the in-island gradient mean on the device: this worker's rank and the
// island's size, and an all-gather of one string over the island (the NCCL id's bootstrap).
struct IslandLink {
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{600000};  // bounds every later gradient mean
  std::function<std::vector<std::string>(const std::string&)> allgather{};
};

// The best measured matrix-multiply rate of the engine's device, for MFU.
struct PeakRate {
  double gflops = 0;
  std::string method;
};

class Engine {
 public:
  virtual ~Engine() = default;

  const ParamLayout& layout() const { return host_model_.layout(); }
  // On a ZeRO-1 rank m and v are null: its moments are a shard (moments()).
  HostBuffers host() {
    const bool whole = !host_opt_.sharded();
    return {host_model_.params().data(), host_model_.grads().data(), whole ? host_opt_.m().data() : nullptr,
            whole ? host_opt_.v().data() : nullptr};
  }
  MomentShard moments() { return {host_opt_.shard(), host_opt_.m().data(), host_opt_.v().data()}; }
  // ZeRO-1 (optim.zero1 with more than one worker in the island): the optimizer holds the
  // moments of this rank's shard only. Then, after the island's gradients are reduce-scattered
  // onto the shards (the island worker's part), clip_grads takes the norm over the island
  // (ZeroLink::sum) and optimizer_step steps the shard and all-gathers the parameters, so every
  // rank ends the step with the same parameters as an unsharded step would leave.
  bool zero1() const { return host_opt_.sharded(); }
  const std::vector<size_t>& zero_shard_sizes() const { return zero_sizes_; }
  void join_zero(const ZeroLink& link) { zero_link_ = link; }
  // The parameters drawn from `seed` into the host copy (then to_device(kParams)).
  void init_params(uint64_t seed) { host_model_.init_params(seed); }

  // "cpu", or the GPU in use (gpu::describe_device).
  virtual std::string device_name() const = 0;

  // The step (see above). B <= micro_batch(cfg.train); gradients of loss_scale * (ce + aux + z)
  // accumulate (+=).
  virtual void zero_grads() = 0;
  virtual LossParts forward_backward(const int32_t* inputs, const int32_t* targets, int B, double loss_scale) = 0;
  // Loss only; with position_losses ([B*T] host memory, =) each position's cross-entropy too
  // (Model::forward).
  virtual LossParts forward(const int32_t* inputs, const int32_t* targets, int B, float* position_losses = nullptr) = 0;
  // Global-norm clipping at max_norm (0 = off) where the gradients live; the norm before it.
  virtual double clip_grads(double max_norm) = 0;
  // One optimizer step at learning rate lr; advances the step count first (the first is t = 1).
  virtual void optimizer_step(double lr) = 0;
  virtual void synchronize() {}
  // Context extension (a data.phases change): sequences of `seq_len` tokens, RoPE base
  // `rope_theta`, micro-batches of up to `micro_batch` from the next step on; parameters,
  // gradients and optimizer state are kept (Model::set_sequence; on the GPU
  // gpu::DeviceModel::set_sequence, the optimizer's moments staying in device memory).
  virtual void set_sequence(int seq_len, double rope_theta, int micro_batch) = 0;

  // The optimizer's step count, wherever it is kept.
  virtual int64_t optimizer_steps() const = 0;
  virtual void set_optimizer_steps(int64_t t) = 0;

  // Copies of `parts` (StatePart flags) from the working buffers to host() and back.
  virtual void to_host(unsigned parts) = 0;
  virtual void to_device(unsigned parts) = 0;
  // The gradient slots of `rows` alone to host().grads: the balancing loads that the metrics
  // read every step are a few dozen floats per layer, not worth the whole gradient's copy.
  virtual void grad_rows_to_host(const std::vector<const ParamEntry*>& rows) = 0;

  // The in-island gradient mean in the engine's own memory (NCCL on the GPU), set up by
  // join_island (collective over the island). False where the engine has none: the caller
  // then averages host().grads (on the CPU, the working copy itself).
  virtual bool has_island_mean() const { return false; }
  virtual void join_island(const IslandLink& link) { (void)link; }
  virtual void island_grad_mean() {}
  // Context parallelism (train.context_parallel, docs/long_context.md): from now on the step
  // takes this rank's zigzag rows of each sequence ([B, T_r] inputs and targets) and runs
  // attention round `group`'s ring (Model::set_context_parallel); null: whole sequences again.
  // ConfigError where the engine has no ring for the model (the CUDA engine: the zaya router and
  // CCA under context parallelism).
  virtual void set_context_parallel(Collective* group);

  // Model::topk_choice_counts of this worker's training passes since zero_grads ([L*E]; empty
  // where the engine does not count them; the CUDA engine counts on the device).
  virtual std::vector<double> topk_choice_counts() const { return {}; }

  // For `atoll bench`: the device's matrix-multiply peak in train.precision's input type, the
  // time of each phase since reset_phase_times() (seconds, by name; empty where not measured),
  // and the device memory the engine holds (bytes; 0 on the CPU).
  virtual PeakRate matmul_peak(Precision precision) const = 0;
  virtual void reset_phase_times() {}
  virtual std::vector<std::pair<std::string, double>> phase_times() { return {}; }
  virtual size_t device_bytes() const { return 0; }

 protected:
  // host_batch: sequences the host model holds activations for (1 when the step runs elsewhere).
  Engine(const Config& cfg, int host_batch, const EngineOptions& opts = {});
  Model<float> host_model_;
  std::vector<size_t> zero_sizes_;  // ZeRO-1: every rank's shard size, in rank order; else empty
  Optimizer host_opt_;
  ZeroLink zero_link_;
};

// The engine train.device names: the CPU engine, or the CUDA engine (ConfigError with the fix
// in a build without CUDA; an Error with the runtime's reason when no GPU is usable).
std::unique_ptr<Engine> make_engine(const Config& cfg, const EngineOptions& opts = {});

}  // namespace atl
