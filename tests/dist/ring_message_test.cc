// Ring messages with compression (dist/ring_message.h): what a peer sends is checked whole.
#include "atoll/dist/ring_message.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "atoll/core/errors.h"
#include "atoll/dist/codec.h"

namespace atl {
namespace {

struct Zstd {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ~Zstd() {
    ZSTD_freeCCtx(c);
    ZSTD_freeDCtx(d);
  }
};

void set_header(std::vector<uint8_t>& msg, uint32_t h) { std::memcpy(msg.data(), &h, sizeof h); }

TEST(RingMessage, WrapThenUnwrapGivesTheCodecBytesRawOrCompressed) {
  Zstd z;
  for (bool compressible : {true, false}) {
    std::vector<uint8_t> codec(1000);
    std::mt19937 rng(7);
    for (size_t i = 0; i < codec.size(); ++i) codec[i] = compressible ? uint8_t(i % 3) : uint8_t(rng());
    std::vector<uint8_t> msg(kRingHeaderBytes + ZSTD_compressBound(codec.size())), plain;
    const size_t size = wrap_ring_message(z.c, codec.data(), codec.size(), msg.data(), msg.size());
    EXPECT_EQ(ring_message_size(msg.data(), msg.size()), size);
    const uint8_t* got = unwrap_ring_message(z.d, msg.data(), msg.size(), codec.size(), plain);
    EXPECT_EQ(std::memcmp(got, codec.data(), codec.size()), 0);
    EXPECT_EQ(compressible, got == plain.data());
  }
}

// A header whose size lies past the receive buffer (a peer of another build, or a hostile
// one): refused before any byte past the buffer is read, compressed or raw.
TEST(RingMessage, SizeBeyondTheBufferIsRefused) {
  Zstd z;
  std::vector<uint8_t> msg(64, 0), plain;
  for (uint32_t h : {0x80000000u | 61u, 0xffffffffu, 61u, 0x7fffffffu}) {
    set_header(msg, h);
    EXPECT_THROW(ring_message_size(msg.data(), msg.size()), PeerLost) << std::hex << h;
    EXPECT_THROW(unwrap_ring_message(z.d, msg.data(), msg.size(), 32, plain), PeerLost) << std::hex << h;
  }
  EXPECT_THROW(ring_message_size(msg.data(), 3), PeerLost);
}

TEST(RingMessage, WrongSizeOrBadFrameIsRefused) {
  Zstd z;
  std::vector<uint8_t> msg(64, 0x5a), plain;
  set_header(msg, 31);  // raw, one byte short
  EXPECT_THROW(unwrap_ring_message(z.d, msg.data(), msg.size(), 32, plain), PeerLost);
  set_header(msg, 0x80000000u | 40u);  // "zstd", but not a frame
  EXPECT_THROW(unwrap_ring_message(z.d, msg.data(), msg.size(), 32, plain), PeerLost);
}

}  // namespace
}  // namespace atl
