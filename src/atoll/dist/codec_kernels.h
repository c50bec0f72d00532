// Internal to dist/: the per-block kernels behind codec.h, in two versions with identical
// results: `ref` (plain scalar loops, the definition) and `fast` (AVX-512 when the build targets
// it, else the same as ref). codec.cc walks the blocks; these handle one block's payload.
#pragma once

#include <cstddef>
#include <cstdint>

namespace atl::codec_detail {

// Largest |x| of a block as the bit pattern of a non-negative float: integer max over
// (bits & 0x7fffffff), so NaN (> inf > every finite value) is never lost the way a float max
// can lose it.
uint32_t absmax_bits_ref(const float* x, size_t m);
uint32_t absmax_bits_fast(const float* x, size_t m);

// q[i] = clamp(round_half_even(x[i] * inv), -qmax, qmax). int8: one byte each; int4: q+8 in
// nibbles (see codec.h), (m+1)/2 bytes.
void int8_quantize_ref(const float* x, size_t m, float inv, int8_t* q);
void int8_quantize_fast(const float* x, size_t m, float inv, int8_t* q);
void int4_quantize_ref(const float* x, size_t m, float inv, uint8_t* q);
void int4_quantize_fast(const float* x, size_t m, float inv, uint8_t* q);

// out[i] = q[i] * scale, or out[i] += q[i] * scale when `add`.
void int8_dequantize_ref(const int8_t* q, size_t m, float scale, float* out, bool add);
void int8_dequantize_fast(const int8_t* q, size_t m, float scale, float* out, bool add);
void int4_dequantize_ref(const uint8_t* q, size_t m, float scale, float* out, bool add);
void int4_dequantize_fast(const uint8_t* q, size_t m, float scale, float* out, bool add);

void bf16_encode_ref(const float* x, size_t n, uint16_t* out);
void bf16_encode_fast(const float* x, size_t n, uint16_t* out);
void bf16_decode_ref(const uint16_t* in, size_t n, float* out, bool add);
void bf16_decode_fast(const uint16_t* in, size_t n, float* out, bool add);

}  // namespace atl::codec_detail
