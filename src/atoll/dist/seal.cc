// Sealed frames and authenticated records (formats and keys in seal.h).
#include "atoll/dist/seal.h"

#include <sodium.h>

#include <cstring>
#include <vector>

#include "atoll/core/check.h"
#include "atoll/core/log.h"

namespace atl {
namespace {

// crypto_kdf's context (8 bytes) and the subkey ids of each purpose.
constexpr char kKdfContext[crypto_kdf_CONTEXTBYTES + 1] = "atollrun";
constexpr uint64_t kFrameKeyId = 1, kRecordKeyId = 2, kVerifierKeyId = 3;
constexpr size_t kRecordMacBytes = 16;
constexpr char kRecordSeparator = '~';

void init_sodium() { ATOLL_CHECK(sodium_init() >= 0) << "libsodium failed to initialise"; }

// The run's master key: BLAKE2b of the secret under a fixed label, so that a token shorter or
// longer than a key still gives one of crypto_kdf's size.
std::array<uint8_t, crypto_kdf_KEYBYTES> master_key(std::string_view secret) {
  ATOLL_CHECK(!secret.empty()) << "sealing needs the run's secret";
  init_sodium();
  static constexpr std::string_view kLabel = "atoll run secret v1";
  std::array<uint8_t, crypto_kdf_KEYBYTES> master{};
  crypto_generichash(master.data(), master.size(), reinterpret_cast<const uint8_t*>(secret.data()), secret.size(),
                     reinterpret_cast<const uint8_t*>(kLabel.data()), kLabel.size());
  return master;
}

std::array<uint8_t, 32> subkey(const std::array<uint8_t, crypto_kdf_KEYBYTES>& master, uint64_t id) {
  std::array<uint8_t, 32> key{};
  crypto_kdf_derive_from_key(key.data(), key.size(), id, kKdfContext, master.data());
  return key;
}

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(uint8_t(v >> (8 * i)));
}
uint32_t get_u32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }

// The additional data: every field of the context, the group's prefix length-prefixed so that no
// two contexts give the same bytes, and the plaintext's size.
std::vector<uint8_t> associated_data(const FrameContext& c, uint64_t n) {
  std::vector<uint8_t> ad;
  ad.reserve(c.group.size() + 48);
  put_u64(ad, c.group.size());
  ad.insert(ad.end(), c.group.begin(), c.group.end());
  ad.push_back(uint8_t(c.purpose));
  put_u64(ad, uint64_t(uint32_t(c.sender)));
  put_u64(ad, uint64_t(uint32_t(c.receiver)));
  put_u64(ad, c.round);
  put_u64(ad, c.seq);
  put_u64(ad, n);
  return ad;
}

const char* purpose_name(SealPurpose p) {
  switch (p) {
    case SealPurpose::kRing: return "ring";
    case SealPurpose::kDirect: return "point-to-point";
    case SealPurpose::kBroadcast: return "broadcast";
    case SealPurpose::kExchange: return "exchange";
  }
  return "?";
}

}  // namespace

Sealer::Sealer(std::string_view run_secret) {
  auto master = master_key(run_secret);
  frame_key_ = subkey(master, kFrameKeyId);
  record_key_ = subkey(master, kRecordKeyId);
  sodium_memzero(master.data(), master.size());
}

Sealer::~Sealer() {
  sodium_memzero(frame_key_.data(), frame_key_.size());
  sodium_memzero(record_key_.data(), record_key_.size());
}

size_t Sealer::seal(const uint8_t* plain, size_t n, const FrameContext& ctx, uint8_t* out) const {
  ATOLL_CHECK_LT(n, size_t{1} << 31) << "frame too large to seal";
  put_u32(out, uint32_t(n));
  uint8_t* nonce = out + sizeof(uint32_t);
  randombytes_buf(nonce, kSealNonceBytes);
  const std::vector<uint8_t> ad = associated_data(ctx, n);
  unsigned long long mac_len = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt_detached(out + kSealHeaderBytes, out + kSealHeaderBytes + n, &mac_len,
                                                      plain, n, ad.data(), ad.size(), nullptr, nonce,
                                                      frame_key_.data());
  return n + kSealOverhead;
}

size_t Sealer::frame_size(const uint8_t* frame, size_t capacity) {
  if (capacity < kSealOverhead) return 0;
  const size_t n = get_u32(frame);
  return n > capacity - kSealOverhead ? 0 : n + kSealOverhead;
}

bool Sealer::try_open(const uint8_t* frame, size_t capacity, const FrameContext& ctx, uint8_t* plain) const {
  const size_t size = frame_size(frame, capacity);
  if (size == 0) return false;
  const size_t n = size - kSealOverhead;
  const std::vector<uint8_t> ad = associated_data(ctx, n);
  return crypto_aead_xchacha20poly1305_ietf_decrypt_detached(plain, nullptr, frame + kSealHeaderBytes, n,
                                                             frame + kSealHeaderBytes + n, ad.data(), ad.size(),
                                                             frame + sizeof(uint32_t), frame_key_.data()) == 0;
}

size_t Sealer::open(const uint8_t* frame, size_t capacity, const FrameContext& ctx, uint8_t* plain,
                    const std::string& from) const {
  if (try_open(frame, capacity, ctx, plain)) return frame_size(frame, capacity) - kSealOverhead;
  const std::string what = std::string("a sealed ") + purpose_name(ctx.purpose) + " frame from " + from + " in " +
                           std::string(ctx.group) + " (round " + std::to_string(ctx.round) + ", message " +
                           std::to_string(ctx.seq) + ") failed authentication: forged, altered on the way, replayed "
                           "or sealed with another run token; dropped, nothing of it applied";
  report_forgery("frame", from, what);
  throw ForgedFrame(what);
}

std::string Sealer::record_mac(std::string_view key, std::string_view value) const {
  crypto_generichash_state st;
  crypto_generichash_init(&st, record_key_.data(), record_key_.size(), kRecordMacBytes);
  const uint64_t klen = key.size();
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(&klen), sizeof klen);
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(key.data()), key.size());
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(value.data()), value.size());
  uint8_t mac[kRecordMacBytes];
  crypto_generichash_final(&st, mac, sizeof mac);
  char hex[2 * kRecordMacBytes + 1];
  sodium_bin2hex(hex, sizeof hex, mac, sizeof mac);
  return std::string(hex, 2 * kRecordMacBytes);
}

std::string Sealer::sign_record(std::string_view key, std::string_view value) const {
  return std::string(value) + kRecordSeparator + record_mac(key, value);
}

std::optional<std::string> Sealer::open_record(std::string_view key, std::string_view stored) const {
  const size_t tail = 1 + 2 * kRecordMacBytes;
  if (stored.size() >= tail && stored[stored.size() - tail] == kRecordSeparator) {
    const std::string_view value = stored.substr(0, stored.size() - tail);
    const std::string expect = record_mac(key, value);
    if (sodium_memcmp(expect.data(), stored.data() + stored.size() - 2 * kRecordMacBytes, expect.size()) == 0)
      return std::string(value);
  }
  report_forgery("record", std::string(key),
                 "the store record " + std::string(key) + " has no valid MAC of the run's key (written without the "
                 "run token): ignored");
  return std::nullopt;
}

void Sealer::set_on_forgery(ForgeryFn fn) {
  std::lock_guard<std::mutex> lock(mu_);
  on_forgery_ = std::move(fn);
}

void Sealer::report_forgery(const std::string& kind, const std::string& from, const std::string& what) const {
  log_warn(what);
  std::lock_guard<std::mutex> lock(mu_);
  if (on_forgery_) on_forgery_(kind, from, what);
}

std::string run_token_verifier(std::string_view run_token) {
  const auto key = subkey(master_key(run_token), kVerifierKeyId);
  char hex[2 * 32 + 1];
  sodium_bin2hex(hex, sizeof hex, key.data(), key.size());
  return std::string(hex, 64);
}

}  // namespace atl
