#include "atoll/engine/engine.h"

#include <optional>

#include "atoll/core/errors.h"
#include "atoll/engine/cpu_engine.h"
#include "atoll/engine/cuda_engine.h"

namespace atl {

int micro_batch(const TrainConfig& t) { return t.micro_batch_size ? t.micro_batch_size : t.batch_size; }

bool wants_gpu(const TrainConfig& t) {
  if (t.device != "cuda") return false;
  if (cuda_engine_built()) return true;
  throw ConfigError(
      "train.device = \"cuda\" needs a CUDA build of atoll, and this one has none; fix: build with "
      "-DATOLL_WITH_CUDA=ON (scripts/build_gpu.sh builds build-cuda), or set train.device = \"cpu\"");
}

void check_island_device(const TrainConfig& t, int workers_per_island) {
  if (!wants_gpu(t) || workers_per_island <= 1 || cuda_engine_has_nccl()) return;
  throw ConfigError("train.device = \"cuda\" with --workers-per-island " + std::to_string(workers_per_island) +
                    " averages gradients with NCCL, and this build has none (no nccl.h and libnccl beside the "
                    "CUDA toolkit when build-cuda was configured); fix: install NCCL and reconfigure, or use "
                    "--workers-per-island 1, or set train.device = \"cpu\"");
}

// ZeRO-1's shard sizes of this engine: empty unless optim.zero1 with more than one worker.
static std::vector<size_t> zero_sizes(const Config& cfg, const ParamLayout& layout, const EngineOptions& opts) {
  if (!cfg.optim.zero1 || opts.island_size <= 1) return {};
  return zero_shard_sizes(layout, opts.island_size);
}

static std::optional<ZeroShard> zero_shard(const std::vector<size_t>& sizes, int rank) {
  if (sizes.empty()) return std::nullopt;
  ZeroShard s;
  for (int r = 0; r < rank; ++r) s.lo += sizes[r];
  s.hi = s.lo + sizes[rank];
  return s;
}

void Engine::set_context_parallel(Collective* group) {
  if (group)
    throw ConfigError("train.context_parallel > 1 runs on the CPU engine only (the GPU ring's kernels exist, "
                      "model/device_ring_attention.h, but the device model does not call them yet); fix: train.device = \"cpu\", or train.context_parallel = 1");
}

Engine::Engine(const Config& cfg, int host_batch, const EngineOptions& opts)
    : host_model_(cfg.model, host_batch, parse_precision(cfg.train.precision)),
      zero_sizes_(zero_sizes(cfg, host_model_.layout(), opts)),
      host_opt_(cfg.optim, host_model_.layout(), zero_shard(zero_sizes_, opts.island_rank)) {
  host_opt_.set_muon_bf16(host_model_.precision() == Precision::kBf16);
}

std::unique_ptr<Engine> make_engine(const Config& cfg, const EngineOptions& opts) {
  if (wants_gpu(cfg.train) && cfg.optim.zero1 && opts.island_size > 1)
    throw ConfigError("optim.zero1 = true with train.device = \"cuda\" and " + std::to_string(opts.island_size) +
                      " workers per island: ZeRO-1 runs on the CPU engine only for now (the CUDA engine averages "
                      "the whole gradient with NCCL); fix: set optim.zero1 = false, or train.device = \"cpu\"");
  if (wants_gpu(cfg.train)) return make_cuda_engine(cfg, opts);
  return std::make_unique<CpuEngine>(cfg, opts);
}

}  // namespace atl
