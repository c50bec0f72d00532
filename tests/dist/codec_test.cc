// Codecs: stated error bounds on varied data, exact cases (zeros, equal values, extremes),
// the NaN policy, bf16 against a bit-level reference, and the AVX-512 paths against the scalar
// definitions bit for bit on awkward sizes.
#include "atoll/dist/codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "atoll/core/errors.h"
#include "dist_test_util.h"

namespace atl {
namespace {

const Codec kAll[] = {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4};
const size_t kSizes[] = {0, 1, 2, 15, 16, 17, 31, 33, 255, 256, 257, 511, 1000, 4099};

std::vector<float> roundtrip(Codec c, const std::vector<float>& x) {
  std::vector<uint8_t> bytes(encoded_bytes(c, x.size()) + 1, 0xEE);
  encode(c, x.data(), x.size(), bytes.data());
  EXPECT_EQ(bytes.back(), 0xEE) << codec_name(c) << ": wrote past encoded_bytes(" << x.size() << ")";
  std::vector<float> y(x.size());
  decode(c, bytes.data(), x.size(), y.data());
  return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::vector<float> varied(size_t n, uint64_t seed) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = testing::test_value(seed, 0, i);
  return x;
}

// |x - q(x)| <= codec_max_error(block absmax) element by element; block = the codec's block.
void expect_within_bound(Codec c, const std::vector<float>& x, const std::vector<float>& y) {
  for (size_t b = 0; b < x.size(); b += kCodecBlock) {
    const size_t e = std::min(x.size(), b + kCodecBlock);
    double absmax = 0;
    for (size_t i = b; i < e; ++i) absmax = std::max(absmax, std::fabs(static_cast<double>(x[i])));
    const double bound = codec_max_error(c, absmax);
    for (size_t i = b; i < e; ++i)
      ASSERT_LE(std::fabs(static_cast<double>(x[i]) - y[i]), bound)
          << codec_name(c) << " element " << i << " of " << x.size();
  }
}

TEST(Codec, NamesParseAndUnknownIsConfigError) {
  for (Codec c : kAll) EXPECT_EQ(parse_codec(codec_name(c)), c);
  EXPECT_THROW(parse_codec("fp8"), ConfigError);
}

TEST(Codec, EncodedBytes) {
  EXPECT_EQ(encoded_bytes(Codec::kFp32, 10), 40u);
  EXPECT_EQ(encoded_bytes(Codec::kBf16, 10), 20u);
  EXPECT_EQ(encoded_bytes(Codec::kInt8, 0), 0u);
  EXPECT_EQ(encoded_bytes(Codec::kInt8, 256), 260u);
  EXPECT_EQ(encoded_bytes(Codec::kInt8, 257), 260u + 5u);
  EXPECT_EQ(encoded_bytes(Codec::kInt4, 256), 132u);
  EXPECT_EQ(encoded_bytes(Codec::kInt4, 3), 4u + 2u);
  // Encoding chunk by chunk (whole blocks) gives the bytes of encoding the whole buffer.
  for (Codec c : kAll) EXPECT_EQ(encoded_bytes(c, 512) + encoded_bytes(c, 77), encoded_bytes(c, 589));
}

TEST(Codec, RoundTripWithinStatedErrorOnEverySize) {
  for (Codec c : kAll)
    for (size_t n : kSizes) {
      const auto x = varied(n, n + 7);
      expect_within_bound(c, x, roundtrip(c, x));
    }
}

TEST(Codec, Fp32IsExact) {
  const auto x = varied(1000, 3);
  const auto y = roundtrip(Codec::kFp32, x);
  EXPECT_TRUE(same_bits(x, y));
}

TEST(Codec, ZerosStayZero) {
  for (Codec c : kAll) {
    const auto y = roundtrip(c, std::vector<float>(300, 0.0f));
    for (float v : y) ASSERT_EQ(v, 0.0f) << codec_name(c);
  }
}

TEST(Codec, BlockOfEqualValuesDecodesToOneValueAtMostTheInput) {
  for (Codec c : {Codec::kInt8, Codec::kInt4})
    for (float v : {1.0f, -3.75f, 0.1f, 1e-20f, 6.0e37f}) {
      const auto y = roundtrip(c, std::vector<float>(256, v));
      for (float d : y) ASSERT_EQ(d, y[0]) << codec_name(c);
      EXPECT_LE(std::fabs(y[0]), std::fabs(v));  // the scale is nudged so |decoded| <= absmax
      EXPECT_LE(std::fabs(y[0] - v), std::fabs(v) * 1e-6) << codec_name(c) << " " << v;
    }
}

TEST(Codec, ExtremeValuesStayFiniteAndWithinBound) {
  const float big = std::numeric_limits<float>::max();
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<std::vector<float>> cases = {
      {big, -big, 1.0f, 0.0f},
      {std::numeric_limits<float>::min(), -std::numeric_limits<float>::min() / 3, 0.0f},
      {tiny, -tiny, 2 * tiny, 0.0f, 5 * tiny},
      {1e-35f, -3e-36f, 7e-38f},
      {1e30f, 1e-30f, -1e10f}};
  for (Codec c : {Codec::kInt8, Codec::kInt4})
    for (const auto& x : cases) {
      const auto y = roundtrip(c, x);
      for (float v : y) ASSERT_TRUE(std::isfinite(v)) << codec_name(c);
      expect_within_bound(c, x, y);
    }
  // bf16: FLT_MAX is past bf16's largest finite value and rounds to inf, as IEEE RNE does.
  EXPECT_TRUE(std::isinf(roundtrip(Codec::kBf16, {big})[0]));
  expect_within_bound(Codec::kBf16, {3.3e38f, -1e-40f, tiny}, roundtrip(Codec::kBf16, {3.3e38f, -1e-40f, tiny}));
}

TEST(Codec, NonFiniteValuesPoisonTheirBlockInInt8AndInt4) {
  for (Codec c : {Codec::kInt8, Codec::kInt4})
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> x(600, 1.0f);
      x[300] = bad;  // second block
      const auto y = roundtrip(c, x);
      for (size_t i = 0; i < 600; ++i) {
        if (i >= 256 && i < 512)
          ASSERT_TRUE(std::isnan(y[i])) << codec_name(c) << " " << i;
        else
          ASSERT_EQ(y[i], 1.0f) << codec_name(c) << " " << i;
      }
    }
  // fp32 and bf16 keep them element by element.
  const std::vector<float> x = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(), 2.0f};
  for (Codec c : {Codec::kFp32, Codec::kBf16}) {
    const auto y = roundtrip(c, x);
    EXPECT_TRUE(std::isnan(y[0]));
    EXPECT_EQ(y[1], -std::numeric_limits<float>::infinity());
    EXPECT_EQ(y[2], 2.0f);
  }
}

// bf16 by the definition: the nearest bf16 value, ties to the even significand, computed with
// doubles and integers rather than the bit trick under test.
uint16_t bf16_by_definition(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t lo = bits & 0xffff0000u, hi = lo + 0x10000u;
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);  // the next bf16 away from zero (may be inf)
  const double dlo = std::fabs(static_cast<double>(x) - flo);
  // Past the largest finite bf16 the next value "away from zero" is 2^128 (IEEE overflow rule).
  const double dhi = std::isinf(fhi) ? std::fabs(std::fabs(static_cast<double>(x)) - 3.4028236692093846e38)
                                     : std::fabs(static_cast<double>(x) - fhi);
  if (dlo < dhi) return static_cast<uint16_t>(lo >> 16);
  if (dhi < dlo) return static_cast<uint16_t>(hi >> 16);
  return static_cast<uint16_t>(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);  // tie: even
}

TEST(Codec, Bf16MatchesTheBitLevelDefinition) {
  std::vector<float> x;
  for (uint32_t i = 0; i < 200000; ++i) {
    uint32_t bits = static_cast<uint32_t>(testing::splitmix64(i));
    if (i % 4 == 0) bits = (bits & 0xffff0000u) | 0x8000u;  // exact ties
    if (i % 4 == 1) bits = (bits & 0xffff0000u) | 0x7fffu;  // just below a tie
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isfinite(f)) x.push_back(f);
  }
  std::vector<uint16_t> out(x.size());
  encode(Codec::kBf16, x.data(), x.size(), reinterpret_cast<uint8_t*>(out.data()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(out[i], bf16_by_definition(x[i])) << "x = " << x[i];
}

TEST(Codec, FastPathsMatchTheScalarDefinitionBitForBit) {
  for (Codec c : kAll)
    for (size_t n : kSizes) {
      auto x = varied(n, 100 + n);
      if (n > 40) x[37] = 0.0f, x[38] = -0.0f;
      std::vector<uint8_t> fast(encoded_bytes(c, n)), ref(encoded_bytes(c, n));
      encode(c, x.data(), n, fast.data());
      encode_reference(c, x.data(), n, ref.data());
      ASSERT_EQ(fast, ref) << codec_name(c) << " n=" << n;
      std::vector<float> a(n), b(n), acc_fast(n, 0.5f), acc_ref(n, 0.5f);
      decode(c, fast.data(), n, a.data());
      decode_reference(c, fast.data(), n, b.data());
      ASSERT_TRUE(same_bits(a, b)) << codec_name(c) << " n=" << n;
      decode_add(c, fast.data(), n, acc_fast.data());
      decode_add_reference(c, fast.data(), n, acc_ref.data());
      ASSERT_TRUE(same_bits(acc_fast, acc_ref)) << codec_name(c) << " n=" << n;
      // decode_add is acc + decode, rounded once (fma) instead of twice: within an ulp of it.
      for (size_t i = 0; i < n; ++i)
        ASSERT_NEAR(acc_fast[i], 0.5f + b[i], 2e-7 * (0.5 + std::fabs(b[i]))) << codec_name(c) << " " << i;
    }
}

TEST(Codec, Int8AndInt4StepsAreTheStatedOnes) {
  // On a block spanning [-A, A] the largest error is close to the half step, not far below it:
  // the bound is tight, so a coarser quantizer would fail the round-trip test.
  std::vector<float> x(kCodecBlock);
  for (size_t i = 0; i < x.size(); ++i) x[i] = -1.0f + 2.0f * static_cast<float>(i) / (x.size() - 1);
  for (Codec c : {Codec::kInt8, Codec::kInt4}) {
    const auto y = roundtrip(c, x);
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(x[i]) - y[i]));
    EXPECT_GT(worst, 0.5 * codec_max_error(c, 1.0)) << codec_name(c);
    EXPECT_LE(worst, codec_max_error(c, 1.0)) << codec_name(c);
  }
}

}  // namespace
}  // namespace atl
