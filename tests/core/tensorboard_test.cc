// The TensorBoard writer's parts against known answers: CRC-32C test vectors (RFC 3720
// appendix B.4 and the "123456789" check value), the masked form TFRecord uses, the record
// framing, and the Event message bytes of one scalar, encoded by hand from the wire format.
#include "atoll/core/tensorboard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace atl {
namespace {

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::string inc(32, '\0');
  for (int i = 0; i < 32; ++i) inc[size_t(i)] = char(i);
  EXPECT_EQ(crc32c(inc.data(), inc.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(Crc32c, MaskRotatesAndAdds) {
  const uint32_t c = crc32c("123456789", 9);
  EXPECT_EQ(masked_crc32c("123456789", 9), uint32_t(((c >> 15) | (c << 17)) + 0xA282EAD8u));
}

TEST(TfRecord, FramesLengthAndData) {
  const std::string data = "abc";
  const std::string r = tfrecord(data);
  ASSERT_EQ(r.size(), 8 + 4 + 3 + 4u);
  uint64_t n;
  std::memcpy(&n, r.data(), 8);
  EXPECT_EQ(n, 3u);
  uint32_t len_crc, data_crc;
  std::memcpy(&len_crc, r.data() + 8, 4);
  std::memcpy(&data_crc, r.data() + 15, 4);
  EXPECT_EQ(len_crc, masked_crc32c(r.data(), 8));
  EXPECT_EQ(r.substr(12, 3), "abc");
  EXPECT_EQ(data_crc, masked_crc32c("abc", 3));
}

// Event{wall_time=1.5, step=300, summary{value{tag="loss", simple_value=2.0}}}, written out
// byte by byte: 0x09 + fixed64 1.5; 0x10 + varint 300 (ac 02); 0x2a len {0x0a len {0x0a 04
// "loss" 0x15 fixed32 2.0f}}.
TEST(TbEvent, ScalarEventBytes) {
  const std::string got = tb_scalars_event(1.5, 300, {{"loss", 2.0f}});
  std::string want = "\x09";
  want += std::string("\x00\x00\x00\x00\x00\x00\xf8\x3f", 8);
  want += "\x10\xac\x02";
  want += "\x2a\x0d\x0a\x0b\x0a\x04loss\x15";
  want += std::string("\x00\x00\x00\x40", 4);
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace atl
