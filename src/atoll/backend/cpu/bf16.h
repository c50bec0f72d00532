// bfloat16 storage: the top 16 bits of an IEEE fp32 (8 exponent bits, 7 mantissa bits), kept
// as uint16_t. Conversion from fp32 rounds to nearest even, as AVX-512 BF16's vcvtneps2bf16
// does; conversion back is exact (a shift). Matrix products read bf16 and accumulate in fp32
// (gemm_bf16.h); everything else stays fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace atl {

using bf16 = uint16_t;

// Unit roundoff of bf16 (8 significant bits): |bf16(x) - x| <= 2^-8 |x|.
inline constexpr double kBf16Unit = 1.0 / 256.0;

inline float bf16_to_float(bf16 h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even; NaN stays NaN (quiet), infinities stay infinite. Branch-free (a select
// would stop GCC from vectorising loops that also call a vector exp).
inline bf16 float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  const uint32_t nan_mask = 0u - uint32_t((bits & 0x7fffffffu) > 0x7f800000u);  // all ones for NaN
  return bf16((rounded & ~nan_mask) | (quiet_nan & nan_mask));
}

// out[n] (=) bf16(in[n]). Vectorised (AVX-512 BF16 where the build targets it) and split over
// the OpenMP threads when n is large; single-threaded inside a parallel region.
void to_bf16(bf16* out, const float* in, size_t n);
// out[n] (=) float(in[n]).
void from_bf16(float* out, const bf16* in, size_t n);
// A rows × cols block with leading dimension ld, packed into out[rows, cols] as bf16.
void to_bf16_2d(bf16* out, const float* in, int rows, int cols, int ld);

}  // namespace atl
