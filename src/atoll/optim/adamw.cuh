// AdamW on the device, fused into one pass; the semantics of optim/adamw.h (torch.optim.AdamW)
// and the same arithmetic: scalars formed in double on the host and rounded once, per-element
// work in fp32 with every product and sum rounded separately (no fused multiply-add), so each
// element matches adamw_update on the CPU bit for bit. Device pointers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "atoll/backend/cuda/vendor.h"
#include "atoll/optim/adamw.h"

namespace atl::gpu {

// params, m, v [n] updated in place; grads [n] read. step counts from 1 (checked).
void adamw_update(float* params, float* m, float* v, const float* grads, size_t n, int64_t step,
                  const AdamWOptions& opt, cudaStream_t stream = nullptr);

}  // namespace atl::gpu
