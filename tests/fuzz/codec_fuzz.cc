// A message of the ring all-reduce as a peer sends it (dist/ring_message.h, dist/codec.h): the
// header and zstd frame of a compressed message, then the codec bytes (fp32, bf16, int8 and
// int4 blocks with their scales) decoded and decode-added, fast paths against the scalar
// definitions bit for bit. Input: [codec (2 bits), compress (1 bit)] [elements: uint16] [message].
#include <zstd.h>

#include <cstring>
#include <vector>

#include "atoll/dist/codec.h"
#include "atoll/dist/ring_message.h"
#include "fuzz/fuzz_target.h"

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

ATOLL_FUZZ_TARGET(codec) {
  if (size < 3) return 0;
  static ZSTD_DCtx* dctx = ZSTD_createDCtx();
  const atl::Codec codec = static_cast<atl::Codec>(data[0] & 3);
  const bool compress = data[0] & 4;
  const size_t n = data[1] | size_t(data[2] & 0x0f) << 8;  // up to 4095 elements: 16 int8 blocks
  const size_t want = atl::encoded_bytes(codec, n);
  // The receive buffer as the ring sizes it (ring_allreduce.cc), holding the peer's bytes.
  const size_t capacity = compress ? atl::kRingHeaderBytes + std::max(want, ZSTD_compressBound(want)) : want;
  std::vector<uint8_t> msg(capacity, 0);
  if (capacity > 0 && size > 3) std::memcpy(msg.data(), data + 3, std::min(capacity, size - 3));
  atl::fuzz::fuzz_reject([&] {
    std::vector<uint8_t> plain;
    const uint8_t* bytes = compress ? atl::unwrap_ring_message(dctx, msg.data(), capacity, want, plain) : msg.data();
    std::vector<float> fast(n), ref(n), acc_fast(n, 1.0f), acc_ref(n, 1.0f);
    atl::decode(codec, bytes, n, fast.data());
    atl::decode_reference(codec, bytes, n, ref.data());
    atl::decode_add(codec, bytes, n, acc_fast.data());
    atl::decode_add_reference(codec, bytes, n, acc_ref.data());
    if (!same_bits(fast, ref) || !same_bits(acc_fast, acc_ref)) __builtin_trap();  // codec.h: bit for bit
  });
  return 0;
}
