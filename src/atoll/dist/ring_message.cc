// Ring messages with compression (format in ring_message.h).
#include "atoll/dist/ring_message.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"

namespace atl {
namespace {

constexpr uint32_t kCompressedBit = 1u << 31;

uint32_t header(const uint8_t* msg) {
  uint32_t h;
  std::memcpy(&h, msg, sizeof h);
  return h;
}

}  // namespace

size_t wrap_ring_message(ZSTD_CCtx* cctx, const uint8_t* codec_bytes, size_t bytes, uint8_t* out, size_t capacity) {
  ATOLL_CHECK(capacity >= kRingHeaderBytes + bytes && bytes < kCompressedBit) << bytes << " bytes into " << capacity;
  const size_t z = ZSTD_compress2(cctx, out + kRingHeaderBytes, capacity - kRingHeaderBytes, codec_bytes, bytes);
  uint32_t h;
  if (!ZSTD_isError(z) && z < bytes) {
    h = kCompressedBit | static_cast<uint32_t>(z);
  } else {
    std::memcpy(out + kRingHeaderBytes, codec_bytes, bytes);
    h = static_cast<uint32_t>(bytes);
  }
  std::memcpy(out, &h, sizeof h);
  return kRingHeaderBytes + (h & ~kCompressedBit);
}

size_t ring_message_size(const uint8_t* msg, size_t capacity) {
  if (capacity < kRingHeaderBytes)
    throw PeerLost("ring message of " + std::to_string(capacity) + " bytes has no header");
  const size_t size = header(msg) & ~kCompressedBit;
  if (size > capacity - kRingHeaderBytes)
    throw PeerLost("ring message header says " + std::to_string(size) + " bytes, more than the " +
                   std::to_string(capacity - kRingHeaderBytes) + " a message holds: the peer runs another build");
  return kRingHeaderBytes + size;
}

const uint8_t* unwrap_ring_message(ZSTD_DCtx* dctx, const uint8_t* msg, size_t capacity, size_t want,
                                   std::vector<uint8_t>& plain) {
  const size_t size = ring_message_size(msg, capacity) - kRingHeaderBytes;
  if (!(header(msg) & kCompressedBit)) {
    if (size != want)
      throw PeerLost("ring message of " + std::to_string(size) + " bytes, expected " + std::to_string(want) +
                     ": the peer runs another build or codec");
    return msg + kRingHeaderBytes;
  }
  plain.resize(std::max(plain.size(), want));
  const size_t got = ZSTD_decompressDCtx(dctx, plain.data(), want, msg + kRingHeaderBytes, size);
  if (ZSTD_isError(got) || got != want)
    throw PeerLost("ring message does not decompress to " + std::to_string(want) + " bytes (" +
                   (ZSTD_isError(got) ? ZSTD_getErrorName(got) : std::to_string(got)) + ")");
  return plain.data();
}

}  // namespace atl
