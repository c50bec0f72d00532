// bfloat16 conversion, on the host and the device. bf16 values are kept as their 16 raw bits
// (uint16_t), so no vendor bf16 type is needed (ROCm 5.2's differs from CUDA's).
#pragma once

#include <cstdint>

#include "atoll/backend/cuda/vendor.h"  // __host__ / __device__

namespace atl::gpu {

// Round to nearest even, NaN kept quiet, as torch and cuBLAS convert.
__host__ __device__ inline uint16_t f32_to_bf16(float f) {
  union {
    float f;
    uint32_t u;
  } x{f};
  if ((x.u & 0x7fffffffu) > 0x7f800000u) return uint16_t((x.u >> 16) | 0x40);  // NaN
  const uint32_t rounding = 0x7fffu + ((x.u >> 16) & 1u);
  return uint16_t((x.u + rounding) >> 16);
}

__host__ __device__ inline float bf16_to_f32(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } x{uint32_t(h) << 16};
  return x.f;
}

}  // namespace atl::gpu
