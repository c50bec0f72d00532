// The CUDA engine's entry points in a build without CUDA (cuda_engine.h): none is built, so
// wants_gpu() refuses train.device = cuda with the fix before anything here is called.
#include "atoll/core/check.h"
#include "atoll/engine/cuda_engine.h"

namespace atl {

bool cuda_engine_built() { return false; }
bool cuda_engine_has_nccl() { return false; }
bool cuda_device_memory(int, double*, double*) { return false; }

std::unique_ptr<Engine> make_cuda_engine(const Config&, const EngineOptions&) {
  ATOLL_CHECK(false) << "make_cuda_engine() in a build without CUDA (wants_gpu() refuses it first)";
  return nullptr;
}

}  // namespace atl
