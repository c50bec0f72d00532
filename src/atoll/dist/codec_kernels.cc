// Block kernels of the pseudo-gradient codecs: scalar definitions and AVX-512 versions that
// must agree with them bit for bit (tests/dist/codec_test.cc checks it on awkward sizes).
//
// Rounding: the scalar code rounds with std::nearbyint in the default rounding mode (to nearest,
// ties to even); _mm512_cvtps_epi32 rounds by MXCSR, which is the same mode. The fast paths do
// whole vectors and leave the tail (fewer than a vector) to the scalar code, so tails agree by
// construction. decode is one IEEE multiplication and decode_add one fused multiply-add, both
// written out (std::fma, _mm512_fmadd_ps), so the compiler's contraction choices cannot make
// the two paths, or two machines, round differently (codec.h).
#include "atoll/dist/codec_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "atoll/dist/codec.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define ATOLL_CODEC_AVX512 1
// GCC 12 warns inside its own AVX-512 headers (the _mm512_undefined_* placeholders of masked
// builtins, GCC bug 105593, fixed in GCC 13); the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#else
#define ATOLL_CODEC_AVX512 0
#endif

namespace atl::codec_detail {

namespace {

inline int quantize_one(float x, float inv, int qmax) {
  const float r = std::nearbyint(x * inv);  // NaN cannot reach here: such blocks have inv = 0
  return static_cast<int>(std::clamp(r, static_cast<float>(-qmax), static_cast<float>(qmax)));
}

}  // namespace

// ---- scalar definitions -------------------------------------------------------------------

uint32_t absmax_bits_ref(const float* x, size_t m) {
  uint32_t best = 0;
  for (size_t i = 0; i < m; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    best = std::max(best, b & 0x7fffffffu);
  }
  return best;
}

void int8_quantize_ref(const float* x, size_t m, float inv, int8_t* q) {
  for (size_t i = 0; i < m; ++i) q[i] = static_cast<int8_t>(quantize_one(x[i], inv, 127));
}

void int4_quantize_ref(const float* x, size_t m, float inv, uint8_t* q) {
  for (size_t j = 0; 2 * j < m; ++j) {
    const int lo = quantize_one(x[2 * j], inv, 7) + 8;
    const int hi = 2 * j + 1 < m ? quantize_one(x[2 * j + 1], inv, 7) + 8 : 0;
    q[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void int8_dequantize_ref(const int8_t* q, size_t m, float scale, float* out, bool add) {
  for (size_t i = 0; i < m; ++i) {
    const float v = static_cast<float>(q[i]);
    out[i] = add ? std::fma(v, scale, out[i]) : v * scale;
  }
}

void int4_dequantize_ref(const uint8_t* q, size_t m, float scale, float* out, bool add) {
  for (size_t i = 0; i < m; ++i) {
    const int nib = (i & 1) ? (q[i / 2] >> 4) : (q[i / 2] & 0x0f);
    const float v = static_cast<float>(nib - 8);
    out[i] = add ? std::fma(v, scale, out[i]) : v * scale;
  }
}

void bf16_encode_ref(const float* x, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    out[i] = float_to_bf16(b);
  }
}

void bf16_decode_ref(const uint16_t* in, size_t n, float* out, bool add) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = static_cast<uint32_t>(in[i]) << 16;
    float v;
    std::memcpy(&v, &b, 4);
    out[i] = add ? out[i] + v : v;
  }
}

// ---- AVX-512 -------------------------------------------------------------------------------

#if ATOLL_CODEC_AVX512

namespace {

// out = q * scale, or out = fma(q, scale, out) when adding.
inline void dequant16(float* out, __m512i q32, __m512 scale, bool add) {
  const __m512 q = _mm512_cvtepi32_ps(q32);
  _mm512_storeu_ps(out, add ? _mm512_fmadd_ps(q, scale, _mm512_loadu_ps(out)) : _mm512_mul_ps(q, scale));
}

inline void store16(float* out, __m512 v, bool add) {
  _mm512_storeu_ps(out, add ? _mm512_add_ps(_mm512_loadu_ps(out), v) : v);
}

// 16 floats -> 16 int32 in [-qmax, qmax], rounded half to even.
inline __m512i quant16(const float* x, __m512 inv, __m512i qmax) {
  const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), inv));
  return _mm512_max_epi32(_mm512_min_epi32(r, qmax), _mm512_sub_epi32(_mm512_setzero_si512(), qmax));
}

}  // namespace

uint32_t absmax_bits_fast(const float* x, size_t m) {
  const __m512i mask = _mm512_set1_epi32(0x7fffffff);
  __m512i best = _mm512_setzero_si512();
  size_t i = 0;
  for (; i + 16 <= m; i += 16) best = _mm512_max_epu32(best, _mm512_and_si512(_mm512_loadu_si512(x + i), mask));
  return std::max(static_cast<uint32_t>(_mm512_reduce_max_epu32(best)), absmax_bits_ref(x + i, m - i));
}

void int8_quantize_fast(const float* x, size_t m, float inv, int8_t* q) {
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i qmax = _mm512_set1_epi32(127);
  size_t i = 0;
  for (; i + 16 <= m; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(quant16(x + i, vinv, qmax)));
  int8_quantize_ref(x + i, m - i, inv, q + i);
}

void int4_quantize_fast(const float* x, size_t m, float inv, uint8_t* q) {
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i qmax = _mm512_set1_epi32(7);
  const __m512i eight = _mm512_set1_epi32(8);
  const __m256i low = _mm256_set1_epi16(0x0f);
  size_t i = 0;
  for (; i + 32 <= m; i += 32) {
    // 32 nibble values as bytes e0..e31, then byte pairs (e2j, e2j+1) as one 16-bit word.
    const __m128i a = _mm512_cvtepi32_epi8(_mm512_add_epi32(quant16(x + i, vinv, qmax), eight));
    const __m128i b = _mm512_cvtepi32_epi8(_mm512_add_epi32(quant16(x + i + 16, vinv, qmax), eight));
    const __m256i w = _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
    const __m256i packed = _mm256_or_si256(_mm256_and_si256(w, low), _mm256_slli_epi16(_mm256_srli_epi16(w, 8), 4));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i / 2), _mm256_cvtepi16_epi8(packed));
  }
  int4_quantize_ref(x + i, m - i, inv, q + i / 2);
}

void int8_dequantize_fast(const int8_t* q, size_t m, float scale, float* out, bool add) {
  const __m512 s = _mm512_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= m; i += 16) {
    const __m512i q32 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)));
    dequant16(out + i, q32, s, add);
  }
  int8_dequantize_ref(q + i, m - i, scale, out + i, add);
}

void int4_dequantize_fast(const uint8_t* q, size_t m, float scale, float* out, bool add) {
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i eight = _mm512_set1_epi32(8);
  const __m256i low = _mm256_set1_epi16(0x0f);
  size_t i = 0;
  for (; i + 32 <= m; i += 32) {
    // 16 bytes -> 16 words (lo nibble | hi nibble << 8) = 32 bytes e0..e31 in element order.
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i / 2)));
    const __m256i w = _mm256_or_si256(_mm256_and_si256(b, low), _mm256_slli_epi16(_mm256_srli_epi16(b, 4), 8));
    const __m512i e0 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(w)), eight);
    const __m512i e1 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(w, 1)), eight);
    dequant16(out + i, e0, s, add);
    dequant16(out + i + 16, e1, s, add);
  }
  int4_dequantize_ref(q + i / 2, m - i, scale, out + i, add);
}

void bf16_encode_fast(const float* x, size_t n, uint16_t* out) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bias = _mm512_set1_epi32(0x7fff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i quiet = _mm512_set1_epi32(0x0040);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(x + i);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i r = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(hi, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(r));
  }
  bf16_encode_ref(x + i, n - i, out + i);
}

void bf16_decode_fast(const uint16_t* in, size_t n, float* out, bool add) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    store16(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)), add);
  }
  bf16_decode_ref(in + i, n - i, out + i, add);
}

#else  // no AVX-512: the plain loops (which the compiler may still vectorise)

uint32_t absmax_bits_fast(const float* x, size_t m) { return absmax_bits_ref(x, m); }
void int8_quantize_fast(const float* x, size_t m, float inv, int8_t* q) { int8_quantize_ref(x, m, inv, q); }
void int4_quantize_fast(const float* x, size_t m, float inv, uint8_t* q) { int4_quantize_ref(x, m, inv, q); }
void int8_dequantize_fast(const int8_t* q, size_t m, float scale, float* out, bool add) {
  int8_dequantize_ref(q, m, scale, out, add);
}
void int4_dequantize_fast(const uint8_t* q, size_t m, float scale, float* out, bool add) {
  int4_dequantize_ref(q, m, scale, out, add);
}
void bf16_encode_fast(const float* x, size_t n, uint16_t* out) { bf16_encode_ref(x, n, out); }
void bf16_decode_fast(const uint16_t* in, size_t n, float* out, bool add) { bf16_decode_ref(in, n, out, add); }

#endif

}  // namespace atl::codec_detail
