// The CUDA engine (engine.h), compiled in CUDA builds only: the step on the device model and
// optimizer (model/device_model.h, optim/device_optimizer.h), the in-island gradient mean with
// NCCL. The host copies (Engine's host model, activations for one sequence only, and host
// optimizer) serve initialisation, checkpoints and DiLoCo's outer step.
#include "atoll/engine/cuda_engine.h"

#include "atoll/backend/cuda/arena.h"
#include "atoll/backend/cuda/device.h"
#include "atoll/backend/cuda/nccl.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/model/device_model.h"
#include "atoll/optim/device_optimizer.h"

namespace atl {
namespace {

// The GPU in use (gpu::describe_device); an Error with the runtime's reason and the fix when
// none is usable.
std::string gpu_in_use() {
  try {
    return gpu::describe_device();
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (train.device = \"cuda\"); fix: run where a GPU is visible, or set "
                "train.device = \"cpu\"");
  }
}

// Makes GPU `index` (modulo the count) current unless it is -1, and describes the GPU in use.
std::string use_gpu(int index) {
  if (index >= 0) {
    gpu_in_use();  // no device: the runtime's reason and the fix, before select_device's bare error
    gpu::select_device(index);
  }
  return gpu_in_use();
}

class CudaEngine final : public Engine {
 public:
  // The device first, so that a machine without one fails with the runtime's reason and the fix.
  CudaEngine(const Config& cfg, const EngineOptions& opts)
      : Engine(cfg, 1),
        name_(use_gpu(opts.device_index)),
        model_(cfg.model, micro_batch(cfg.train), {.precision = parse_precision(cfg.train.precision)}),
        opt_(cfg.optim, model_.layout()) {}

  std::string device_name() const override { return name_; }
  void zero_grads() override { model_.zero_grads(); }
  std::vector<double> topk_choice_counts() const override { return model_.topk_choice_counts(); }
  LossParts forward_backward(const int32_t* inputs, const int32_t* targets, int B, double loss_scale) override {
    return model_.forward_backward(inputs, targets, B, loss_scale);
  }
  LossParts forward(const int32_t* inputs, const int32_t* targets, int B, float* position_losses = nullptr) override {
    return model_.forward(inputs, targets, B, position_losses);
  }
  double clip_grads(double max_norm) override { return opt_.clip_grad_norm(model_.grads(), max_norm); }
  void optimizer_step(double lr) override { opt_.step(model_.params(), model_.grads(), lr); }
  void synchronize() override { gpu::synchronize(); }
  // The device model's arena is made again at the new length; the optimizer's moments (their
  // own buffers) stay where they are. The host model follows for the config it reports.
  void set_sequence(int seq_len, double rope_theta, int micro_batch) override {
    model_.set_sequence(seq_len, rope_theta, micro_batch);
    host_model_.set_sequence(seq_len, rope_theta, 1);
  }
  // The device model holds this rank's zigzag rows and runs GQA attention round the group's ring
  // (gpu::DeviceModel::set_context_parallel); its arena is made again for them, the state kept.
  void set_context_parallel(Collective* group) override { model_.set_context_parallel(group); }
  int64_t optimizer_steps() const override { return opt_.step_count(); }
  void set_optimizer_steps(int64_t t) override {
    opt_.set_step_count(t);
    host_opt_.set_step_count(t);
  }

  void to_host(unsigned parts) override {
    const HostBuffers h = host();
    if (parts & kParams) model_.download_params(h.params);
    if (parts & kGrads) model_.download_grads(h.grads);
    if (parts & kMoments) {
      opt_.download_state(h.m, h.v);
      host_opt_.set_step_count(opt_.step_count());
    }
  }
  void to_device(unsigned parts) override {
    const HostBuffers h = host();
    if (parts & kParams) model_.upload_params(h.params);
    if (parts & kGrads) model_.upload_grads(h.grads);
    if (parts & kMoments) {
      opt_.upload_state(h.m, h.v);
      opt_.set_step_count(host_opt_.step_count());
    }
  }

  void grad_rows_to_host(const std::vector<const ParamEntry*>& rows) override {
    const HostBuffers h = host();
    for (const ParamEntry* row : rows)
      gpu::copy_to_host(h.grads + row->offset, model_.grads() + row->offset, sizeof(float) * row->numel);
  }

  bool has_island_mean() const override { return nccl_ != nullptr; }
  void join_island(const IslandLink& link) override {
    if (link.size == 1) return;
    const std::vector<std::string> ids = link.allgather(link.rank == 0 ? gpu::nccl_unique_id() : std::string());
    nccl_ = std::make_unique<gpu::NcclComm>(ids.at(0), link.rank, link.size, link.timeout);
  }
  void island_grad_mean() override {
    ATOLL_CHECK(nccl_) << "island_grad_mean() needs join_island() with more than one worker";
    nccl_->allreduce_mean(model_.grads(), layout().total());
  }

  PeakRate matmul_peak(Precision precision) const override {
    const bool bf16 = precision == Precision::kBf16;
    return {.gflops = gpu::measure_matmul_peak_gflops(4096, 5, bf16),
            .method = std::string("best of 5 ") +
                      (bf16 ? "bf16 cuBLAS GemmEx (fp32 accumulation)" : "fp32 cuBLAS sgemm") + " 4096x4096x4096"};
  }
  size_t device_bytes() const override { return model_.device_bytes(); }

 private:
  std::string name_;
  gpu::DeviceModel model_;
  gpu::DeviceOptimizer opt_;
  std::unique_ptr<gpu::NcclComm> nccl_;  // the island's, with several workers per island
};

}  // namespace

bool cuda_engine_built() { return true; }
bool cuda_engine_has_nccl() { return gpu::nccl_available(); }

bool cuda_device_memory(int device_index, double* free_bytes, double* total_bytes) {
  try {
    gpu::describe_device();  // GpuError when none is usable, before select_device's bare one
    if (device_index >= 0) gpu::select_device(device_index);
    size_t free_b = 0, total_b = 0;
    gpu::memory_info(&free_b, &total_b);
    *free_bytes = double(free_b), *total_bytes = double(total_b);
    return true;
  } catch (const Error&) {
    return false;  // the engine itself then reports why no GPU is usable
  }
}

std::unique_ptr<Engine> make_cuda_engine(const Config& cfg, const EngineOptions& opts) {
  return std::make_unique<CudaEngine>(cfg, opts);
}

}  // namespace atl
