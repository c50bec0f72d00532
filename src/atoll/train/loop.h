// What one training process holds and does per step, shared by the single-process trainer
// (trainer.h) and the island worker (island_trainer.h): the model, the inner optimizer, this
// worker's slice of the training data and the validation split; one batch's gradients with
// gradient accumulation over micro-batches; validation; the checkpoint state.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "atoll/atoll_config.h"
#include "atoll/ckpt/checkpoint.h"
#include "atoll/config/config.h"
#include "atoll/data/loader.h"
#include "atoll/model/model.h"
#include "atoll/optim/optimizer.h"

namespace atl {

class ProcessGroup;  // dist/group.h

int micro_batch(const TrainConfig& t);

// Whether train.device asks for the GPU ("cuda"). ConfigError, naming the key and the fix, for
// cuda in a build without CUDA. train.precision = bf16 works on both (bf16 products, fp32
// master weights); on the GPU Muon's Newton-Schulz stays fp32.
bool wants_gpu(const TrainConfig& t);

// Island workers (`atoll launch`, `atoll worker`) with train.device = cuda and more than one
// worker per island average gradients with NCCL: ConfigError, with the fix, in a build
// without it. Nothing to check on the CPU or with one worker per island.
void check_island_device(const TrainConfig& t, int workers_per_island);

#if ATOLL_WITH_CUDA
// The GPU that train.device = cuda uses (gpu::describe_device); an Error with the runtime's
// reason and the fix when none is usable.
std::string gpu_in_use();
#endif

// Mean cross-entropy over the first eval_batches micro-batches of the validation split.
double evaluate(Model<float>& model, DataLoader& val, const Config& cfg);

// train.device = cuda: the model and optimizer state on the GPU (defined in loop.cc).
struct DeviceLoop;

struct Loop {
  const Config& cfg;
  // On the GPU, `model` and `opt` hold the host copies of the parameters and moments, for
  // initialisation and checkpoints (to_device, to_host); the host model then has activations
  // for one sequence only.
  Model<float> model;
  Optimizer opt;
  DataLoader train_data;
  std::unique_ptr<DataLoader> val_data;  // absent when the data has no validation split
  int64_t step = 0, tokens = 0;
  std::vector<int32_t> in, tg;  // [micro_batch, T] inputs and targets
  std::unique_ptr<DeviceLoop> device;  // null: the step runs on the CPU

  // Worker `worker` of `n_workers` reads its own slice of the training data (loader.h). With
  // train.device = cuda the step runs on GPU `device_index` modulo the device count (an island
  // worker's rank in its island), or on the current GPU when it is -1; callers then step
  // through gradients/clip_grads/optimizer_step/validate, which work where the step runs.
  Loop(const Config& c, const std::string& data_dir, int worker = 0, int n_workers = 1, int device_index = -1);
  ~Loop();

  // zero grads, then forward/backward over batch / micro_batch micro-batches of the next
  // `batch` training windows: grads [layout.total()] hold the batch mean. Returns the mean loss.
  LossParts gradients(int batch);
  // Global-norm clipping with optim.grad_clip where the gradients live; the norm before it.
  double clip_grads();
  // One optimizer step at learning rate lr where the parameters live.
  void optimizer_step(double lr);
  // evaluate() on the validation split (val_data must exist), on the GPU when training there.
  double validate();

  // The GPU's copies from the host ones (after init_params or a restore), and back (before a
  // checkpoint). No-ops on the CPU.
  void to_device();
  void to_host();
  // Parameters only (not the moments), device -> host and back: around DiLoCo's outer step,
  // which runs on the host copy over Gloo. No-ops on the CPU.
  void params_to_host();
  void params_to_device();
  // Gradients, device -> host and back: around a gradient mean over Gloo (the data-parallel
  // warm start of a multi-island run). No-ops on the CPU.
  void grads_to_host();
  void grads_to_device();

  // On the GPU with several workers in the island: the island's NCCL communicator, bootstrapped
  // through `island` (rank 0's id reaches every rank by allgather). Collective over `island`;
  // a no-op on the CPU or alone.
  void join_island(ProcessGroup& island);
  // The island's mean gradient, in place in device memory (NCCL; after join_island).
  void average_device_grads();

  // "cpu", or the GPU in use (gpu::describe_device).
  std::string device_name() const;

  std::vector<CheckpointBuffer> buffers();
  nlohmann::json state() const;
  void restore(const nlohmann::json& s);
};

}  // namespace atl
