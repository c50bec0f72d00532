// One message of the ring all-reduce with compression on (ring_allreduce.h, `compress`): a
// little-endian uint32 header, then the payload. The header's top bit says the payload is a zstd
// frame; the other 31 bits are the payload's size. Without the bit the payload is the codec
// bytes themselves (sent raw when zstd does not shrink them).
//
// The bytes come from a peer, so unwrap trusts none of them: the size must fit the receive
// buffer, a raw payload must be exactly the codec bytes expected, and a zstd frame must
// decompress to exactly them. Anything else is a PeerLost naming the problem.
#pragma once

#include <zstd.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace atl {

inline constexpr size_t kRingHeaderBytes = sizeof(uint32_t);

// Writes the message for `bytes` codec bytes into out[capacity] (capacity >= kRingHeaderBytes +
// max(bytes, ZSTD_compressBound(bytes))): zstd when smaller, else raw. Returns its size.
size_t wrap_ring_message(ZSTD_CCtx* cctx, const uint8_t* codec_bytes, size_t bytes, uint8_t* out, size_t capacity);

// The whole size of the message at msg (header included), checked against the buffer of
// `capacity` bytes it was received into (PeerLost if it does not fit).
size_t ring_message_size(const uint8_t* msg, size_t capacity);

// The `want` codec bytes of the message received into msg[capacity]: msg's own payload, or
// decompressed into `plain` (resized to want). Throws PeerLost for a message that is not one.
const uint8_t* unwrap_ring_message(ZSTD_DCtx* dctx, const uint8_t* msg, size_t capacity, size_t want,
                                   std::vector<uint8_t>& plain);

}  // namespace atl
