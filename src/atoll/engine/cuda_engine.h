// What the factory (engine.cc) knows of the CUDA engine. Defined by cuda_engine.cc in CUDA builds
// and by cuda_engine_none.cc in the others, so that no source carries a build switch.
#pragma once

#include <memory>

#include "atoll/engine/engine.h"

namespace atl {

// Whether this build has the CUDA engine, and NCCL for its in-island gradient mean.
bool cuda_engine_built();
bool cuda_engine_has_nccl();

// Free and total memory of GPU `device_index` (modulo the count; -1: the current one), bytes;
// false when no GPU is usable or the build has no CUDA.
bool cuda_device_memory(int device_index, double* free_bytes, double* total_bytes);

// The CUDA engine on GPU opts.device_index (see EngineOptions); only called when
// cuda_engine_built().
std::unique_ptr<Engine> make_cuda_engine(const Config& cfg, const EngineOptions& opts);

}  // namespace atl
