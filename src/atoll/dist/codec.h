// Codecs for DiLoCo pseudo-gradients (DESIGN.md, "DiLoCo"): how a flat fp32 buffer travels
// between islands. The ring all-reduce (ring_allreduce.h) encodes every chunk it sends with one
// of these and decodes (or decode-adds) every chunk it receives.
//
//   fp32  identity (4 bytes/element).
//   bf16  the top 16 bits, rounded to nearest, ties to even (2 bytes/element).
//   int8  blocks of kCodecBlock elements: one fp32 scale = absmax/127, then one int8 per
//         element q = round(x/scale) in [-127, 127] (symmetric, so 0 stays exactly 0).
//   int4  as int8 with scale = absmax/7 and q in [-7, 7], stored as q+8 in a nibble; element
//         2j in the low nibble of byte j of the block, element 2j+1 in the high nibble.
//
// Encoded layout: blocks one after another, each [scale (fp32, little endian)][payload]; the last
// block may be short. Encoding a buffer chunk by chunk (chunks a multiple of kCodecBlock long)
// gives the same bytes as encoding it whole, which is what lets the ring pipeline chunks.
//
// Stated error (what the tests check): for every element x of a block with absolute maximum A,
//   |x - decode(encode(x))| <= codec_max_error(codec, A)
//   fp32: 0;  bf16: A * 2^-8;  int8: A/254;  int4: A/14  (each times (1 + 2^-12) for the fp32
//   rounding of scale and product, plus 1e-37 absolute for blocks of subnormal size).
// bf16's bound holds per element too (|x| * 2^-8) for |x| up to bf16's largest finite value
// 3.3895e38; larger finite values round to +-inf, as IEEE round-to-nearest does.
//
// Non-finite values (NaN policy): fp32 and bf16 keep them element by element (a NaN stays a
// quiet NaN, +-inf stays +-inf). In int8/int4 a NaN or inf poisons its whole block: the scale
// becomes NaN and every element of the block decodes to NaN, so a broken pseudo-gradient is
// seen (and rolled back) rather than silently clipped. -0.0 decodes to +0.0 in int8/int4.
//
// Decoding is one IEEE multiplication per element (q * scale) or a bit shift (bf16), so every
// machine decodes the same bytes to the same floats: the ring relies on this for
// bit-identical results across islands. The hot loops use AVX-512 where the build targets it
// (-march=native) and plain loops otherwise; the *_reference functions are the scalar
// definitions the fast paths are tested against, bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace atl {

enum class Codec { kFp32, kBf16, kInt8, kInt4 };

inline constexpr size_t kCodecBlock = 256;  // elements per scale block (int8, int4)

// "fp32" | "bf16" | "int8" | "int4" (diloco.codec); anything else throws ConfigError.
Codec parse_codec(std::string_view name);
const char* codec_name(Codec codec);

// Bytes that encode() writes for n elements.
size_t encoded_bytes(Codec codec, size_t n);

// out[encoded_bytes(codec, n)] <- encoding of x[n].
void encode(Codec codec, const float* x, size_t n, uint8_t* out);
// out[n] <- decoded values (overwritten).
void decode(Codec codec, const uint8_t* in, size_t n, float* out);
// acc[n] += decoded values: fma(q, scale, acc) for int8/int4 (one rounding), acc + value for
// fp32/bf16.
void decode_add(Codec codec, const uint8_t* in, size_t n, float* acc);

// The stated bound above: largest |x - decode(encode(x))| for an element of a block whose
// absolute maximum is `block_absmax`.
double codec_max_error(Codec codec, double block_absmax);

// Scalar definitions (no SIMD), for tests of the fast paths.
void encode_reference(Codec codec, const float* x, size_t n, uint8_t* out);
void decode_reference(Codec codec, const uint8_t* in, size_t n, float* out);
void decode_add_reference(Codec codec, const uint8_t* in, size_t n, float* acc);

// bf16 of one float, round to nearest even (NaN kept quiet): the bit-level definition.
inline uint16_t float_to_bf16(uint32_t bits) {
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace atl
