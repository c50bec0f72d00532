// Sealed traffic between islands (docs/islands.md "Sealed traffic"): every frame of the outer
// group (the pseudo-gradient ring, state transfers, the small collectives) is encrypted and
// authenticated with XChaCha20-Poly1305 (libsodium's crypto_aead_xchacha20poly1305_ietf), and
// the store's records that admit or describe members, and the checkpoint parts, carry a MAC
// (keyed BLAKE2b, crypto_generichash).
//
// Keys: the run's secret is its run token (RUN_DIR/run.token, written by `atoll launch`, or
// ATOLL_RUN_TOKEN / --token-file for workers started by hand). It never travels: the store keeps
// only a verifier of it (run_token_verifier, for the door), and the keys are derived from it
// locally, one per purpose (crypto_kdf: frames, records, verifier), so one purpose's key tells
// nothing of another's.
//
// Frames: [uint32 LE n][24-byte random nonce][n bytes of ciphertext][16-byte tag]. Random 192-bit
// nonces never repeat under one key in practice (2^96 frames for a 2^-96 chance), with no counter
// to keep across restarts. The additional data binds the frame to its context: the group's
// prefix (run id, group name, membership epoch), the purpose, sender and receiver ranks, the
// collective's round and the message's sequence number, and n. A frame replayed from another
// round, epoch, pair or run, cut short, or altered in any bit fails to open.
//
// Records: value + "~" + 32 hex digits, the MAC of (key, value); the key binds a record to its
// place, so a record copied to another key fails too.
//
// A frame or record that fails is never applied: open() says false, open_record() nullopt, and
// the sealer reports it (on_forgery: train/ writes a `forged_frame` event naming the peer).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "atoll/core/errors.h"

namespace atl {

// A frame from a peer that failed authentication: forged, altered on the way, replayed from
// another round, or sealed with another run's secret. The ring and the group fail as they do for a
// lost peer (nothing of the frame is applied).
class ForgedFrame : public PeerLost {
 public:
  using PeerLost::PeerLost;
};

enum class SealPurpose : uint8_t { kRing = 1, kDirect = 2, kBroadcast = 3, kExchange = 4 };

// What a frame is, bound into its tag.
struct FrameContext {
  std::string_view group;  // the group's prefix: "atoll/<run>/<name>/e<epoch>"
  SealPurpose purpose = SealPurpose::kRing;
  int32_t sender = 0;
  int32_t receiver = -1;  // -1: every other member (a broadcast, an exchange)
  uint64_t round = 0;     // the collective's tag, or the pair's message count
  uint64_t seq = 0;       // within the round (the ring: its slot)
};

inline constexpr size_t kSealNonceBytes = 24;
inline constexpr size_t kSealTagBytes = 16;
inline constexpr size_t kSealHeaderBytes = sizeof(uint32_t) + kSealNonceBytes;
inline constexpr size_t kSealOverhead = kSealHeaderBytes + kSealTagBytes;  // bytes a frame adds

class Sealer {
 public:
  // Derives the keys from the run's secret (not empty); the secret itself is not kept.
  explicit Sealer(std::string_view run_secret);
  ~Sealer();
  Sealer(const Sealer&) = delete;
  Sealer& operator=(const Sealer&) = delete;

  // Writes the frame of plain[n] into out[n + kSealOverhead] (out must not overlap plain).
  // Returns the frame's size.
  size_t seal(const uint8_t* plain, size_t n, const FrameContext& ctx, uint8_t* out) const;
  // The size of the frame at frame[capacity] (its header's n + kSealOverhead); 0 when the header
  // is cut short or claims more than capacity holds.
  static size_t frame_size(const uint8_t* frame, size_t capacity);
  // Opens the frame at frame[capacity] into plain[frame_size - kSealOverhead]. Throws ForgedFrame
  // (`from` names the peer: "island 2 rank 0") and reports it when it fails; plain is then
  // unspecified (callers open into scratch, or into buffers a failure leaves to be discarded).
  // Returns the plaintext's size.
  size_t open(const uint8_t* frame, size_t capacity, const FrameContext& ctx, uint8_t* plain,
              const std::string& from) const;
  // The same without throwing or reporting: whether it opened (tests, benchmarks).
  bool try_open(const uint8_t* frame, size_t capacity, const FrameContext& ctx, uint8_t* plain) const;

  // A store record: value with its MAC appended, and back (nullopt, reported, when the MAC is
  // missing or wrong: a record written without the key).
  std::string sign_record(std::string_view key, std::string_view value) const;
  std::optional<std::string> open_record(std::string_view key, std::string_view stored) const;

  // Told of each frame or record that failed (from any thread; one call at a time): kind "frame"
  // (from: the peer, "island 2 rank 0") or "record" (from: the store key), and why.
  using ForgeryFn = std::function<void(const std::string& kind, const std::string& from, const std::string& what)>;
  void set_on_forgery(ForgeryFn fn);
  void report_forgery(const std::string& kind, const std::string& from, const std::string& what) const;

 private:
  std::string record_mac(std::string_view key, std::string_view value) const;

  std::array<uint8_t, 32> frame_key_{};
  std::array<uint8_t, 32> record_key_{};
  mutable std::mutex mu_;
  ForgeryFn on_forgery_;
};

// What the store keeps of the run's token (members/run_token), so that the token, and with it the
// sealing keys, never travel: 64 hex digits derived from it with a key of its own.
std::string run_token_verifier(std::string_view run_token);

}  // namespace atl
