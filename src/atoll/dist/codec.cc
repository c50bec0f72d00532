// Pseudo-gradient codecs: block layout, scales and dispatch (format and error bounds in
// codec.h; the per-block loops in codec_kernels.cc).
#include "atoll/dist/codec.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/dist/codec_kernels.h"

namespace atl {

namespace cd = codec_detail;

namespace {

// Below this absmax, qmax/absmax may overflow a float; such blocks quantize in double.
constexpr float kTinyAbsmax = 1e-30f;

struct BlockScale {
  float scale = 0;  // what is stored; decode multiplies by it
  float inv = 0;    // what encode multiplies by (0 for zero and non-finite blocks)
  bool tiny = false;
};

// The scale of a block with absolute maximum bits `abs_bits`. The stored scale is absmax/qmax,
// nudged down one ulp where qmax*scale would round above absmax, so a decoded value never
// exceeds the block's absmax (FLT_MAX stays finite).
BlockScale block_scale(uint32_t abs_bits, int qmax) {
  BlockScale s;
  if (abs_bits >= 0x7f800000u) {  // inf or NaN: the whole block decodes to NaN (codec.h)
    s.scale = std::numeric_limits<float>::quiet_NaN();
    return s;
  }
  if (abs_bits == 0) return s;
  float absmax;
  std::memcpy(&absmax, &abs_bits, 4);
  const float q = static_cast<float>(qmax);
  s.scale = absmax / q;
  if (s.scale * q > absmax) s.scale = std::nextafter(s.scale, 0.0f);
  s.tiny = absmax < kTinyAbsmax;
  s.inv = s.tiny ? 0.0f : q / absmax;
  if (s.tiny) s.scale = s.scale > 0 ? s.scale : std::numeric_limits<float>::denorm_min();
  return s;
}

// Tiny blocks: x/scale in double, where it cannot overflow. Rare, so scalar.
void quantize_tiny(const float* x, size_t m, float scale, int qmax, int8_t* q8, uint8_t* q4) {
  for (size_t i = 0; i < m; ++i) {
    double r = std::nearbyint(static_cast<double>(x[i]) / static_cast<double>(scale));
    const int v = static_cast<int>(std::fmax(-qmax, std::fmin(qmax, r)));
    if (q8) q8[i] = static_cast<int8_t>(v);
    if (q4) q4[i / 2] = static_cast<uint8_t>((i & 1) ? (q4[i / 2] | ((v + 8) << 4)) : (v + 8));
  }
}

size_t payload_bytes(Codec c, size_t m) { return c == Codec::kInt8 ? m : (m + 1) / 2; }

// Encodes one block of m <= kCodecBlock elements at `out`; returns the bytes written.
size_t encode_block(Codec c, const float* x, size_t m, uint8_t* out, bool fast) {
  const int qmax = c == Codec::kInt8 ? 127 : 7;
  const BlockScale s = block_scale(fast ? cd::absmax_bits_fast(x, m) : cd::absmax_bits_ref(x, m), qmax);
  std::memcpy(out, &s.scale, 4);
  uint8_t* payload = out + 4;
  const size_t bytes = payload_bytes(c, m);
  if (s.tiny) {
    std::memset(payload, 0, bytes);
    quantize_tiny(x, m, s.scale, qmax, c == Codec::kInt8 ? reinterpret_cast<int8_t*>(payload) : nullptr,
                  c == Codec::kInt4 ? payload : nullptr);
  } else if (s.inv == 0.0f) {  // zero or non-finite block: the scale alone decides
    std::memset(payload, c == Codec::kInt8 ? 0 : 0x88, bytes);
    if (c == Codec::kInt4 && (m & 1)) payload[bytes - 1] = 0x08;
  } else if (c == Codec::kInt8) {
    auto* q = reinterpret_cast<int8_t*>(payload);
    fast ? cd::int8_quantize_fast(x, m, s.inv, q) : cd::int8_quantize_ref(x, m, s.inv, q);
  } else {
    fast ? cd::int4_quantize_fast(x, m, s.inv, payload) : cd::int4_quantize_ref(x, m, s.inv, payload);
  }
  return 4 + bytes;
}

size_t decode_block(Codec c, const uint8_t* in, size_t m, float* out, bool add, bool fast) {
  float scale;
  std::memcpy(&scale, in, 4);
  const uint8_t* payload = in + 4;
  if (c == Codec::kInt8) {
    auto* q = reinterpret_cast<const int8_t*>(payload);
    fast ? cd::int8_dequantize_fast(q, m, scale, out, add) : cd::int8_dequantize_ref(q, m, scale, out, add);
  } else {
    fast ? cd::int4_dequantize_fast(payload, m, scale, out, add) : cd::int4_dequantize_ref(payload, m, scale, out, add);
  }
  return 4 + payload_bytes(c, m);
}

void encode_impl(Codec c, const float* x, size_t n, uint8_t* out, bool fast) {
  switch (c) {
    case Codec::kFp32:
      if (n) std::memcpy(out, x, n * 4);
      return;
    case Codec::kBf16: {
      auto* o = reinterpret_cast<uint16_t*>(out);  // byte buffers from new[]/vector are aligned
      fast ? cd::bf16_encode_fast(x, n, o) : cd::bf16_encode_ref(x, n, o);
      return;
    }
    case Codec::kInt8:
    case Codec::kInt4:
      for (size_t i = 0; i < n; i += kCodecBlock)
        out += encode_block(c, x + i, std::min(kCodecBlock, n - i), out, fast);
      return;
  }
}

void decode_impl(Codec c, const uint8_t* in, size_t n, float* out, bool add, bool fast) {
  switch (c) {
    case Codec::kFp32:
      if (!add) {
        if (n) std::memcpy(out, in, n * 4);
      } else {
        const auto* v = reinterpret_cast<const float*>(in);
        for (size_t i = 0; i < n; ++i) out[i] += v[i];
      }
      return;
    case Codec::kBf16: {
      const auto* v = reinterpret_cast<const uint16_t*>(in);
      fast ? cd::bf16_decode_fast(v, n, out, add) : cd::bf16_decode_ref(v, n, out, add);
      return;
    }
    case Codec::kInt8:
    case Codec::kInt4:
      for (size_t i = 0; i < n; i += kCodecBlock)
        in += decode_block(c, in, std::min(kCodecBlock, n - i), out + i, add, fast);
      return;
  }
}

}  // namespace

Codec parse_codec(std::string_view name) {
  if (name == "fp32") return Codec::kFp32;
  if (name == "bf16") return Codec::kBf16;
  if (name == "int8") return Codec::kInt8;
  if (name == "int4") return Codec::kInt4;
  throw ConfigError("unknown codec '" + std::string(name) + "' (expected fp32, bf16, int8 or int4)");
}

const char* codec_name(Codec codec) {
  switch (codec) {
    case Codec::kFp32:
      return "fp32";
    case Codec::kBf16:
      return "bf16";
    case Codec::kInt8:
      return "int8";
    case Codec::kInt4:
      return "int4";
  }
  return "?";
}

size_t encoded_bytes(Codec codec, size_t n) {
  switch (codec) {
    case Codec::kFp32:
      return 4 * n;
    case Codec::kBf16:
      return 2 * n;
    case Codec::kInt8:
    case Codec::kInt4: {
      const size_t full = n / kCodecBlock, rest = n % kCodecBlock;
      return full * (4 + payload_bytes(codec, kCodecBlock)) + (rest ? 4 + payload_bytes(codec, rest) : 0);
    }
  }
  return 0;
}

void encode(Codec codec, const float* x, size_t n, uint8_t* out) { encode_impl(codec, x, n, out, true); }
void decode(Codec codec, const uint8_t* in, size_t n, float* out) { decode_impl(codec, in, n, out, false, true); }
void decode_add(Codec codec, const uint8_t* in, size_t n, float* acc) { decode_impl(codec, in, n, acc, true, true); }
void encode_reference(Codec codec, const float* x, size_t n, uint8_t* out) { encode_impl(codec, x, n, out, false); }
void decode_reference(Codec codec, const uint8_t* in, size_t n, float* out) {
  decode_impl(codec, in, n, out, false, false);
}
void decode_add_reference(Codec codec, const uint8_t* in, size_t n, float* acc) {
  decode_impl(codec, in, n, acc, true, false);
}

double codec_max_error(Codec codec, double block_absmax) {
  // fp32 rounding of scale, 1/scale, x*inv and q*scale moves each result by a few ulps of
  // absmax, i.e. ~2^-22 * absmax: a relative 2^-12 on the half step covers it with room.
  constexpr double kRounding = 1.0 + 1.0 / (1 << 12);
  constexpr double kTinySlack = 1e-37;  // blocks whose scale is subnormal
  switch (codec) {
    case Codec::kFp32:
      return 0.0;
    case Codec::kBf16:
      return block_absmax / 256.0 * kRounding + kTinySlack;
    case Codec::kInt8:
      return block_absmax / 254.0 * kRounding + kTinySlack;
    case Codec::kInt4:
      return block_absmax / 14.0 * kRounding + kTinySlack;
  }
  return 0.0;
}

}  // namespace atl
