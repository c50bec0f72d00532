#include "atoll/data/word_split.h"

#include <cstdint>
#include <functional>

namespace atl {

namespace {

// The fields read, numbered as in SentencePiece's sentencepiece_model.proto (proto2; an absent
// field takes the default noted beside it).
constexpr uint32_t kModelPieces = 1, kModelTrainerSpec = 2, kModelNormalizerSpec = 3;
constexpr uint32_t kPiecePiece = 1, kPieceType = 3;  // type: NORMAL = 1 by default
constexpr uint32_t kPieceTypeUserDefined = 4;
constexpr uint32_t kTrainerModelType = 3;                // UNIGRAM = 1 by default
constexpr uint32_t kTrainerSplitByWhitespace = 22;       // true by default
constexpr uint32_t kTrainerTreatWhitespaceAsSuffix = 24;  // false by default
constexpr uint32_t kTrainerByteFallback = 35;             // false by default
constexpr uint32_t kModelTypeBpe = 2;
constexpr uint32_t kNormName = 1, kNormCharsmap = 2, kNormAddDummyPrefix = 3, kNormRemoveExtraWhitespaces = 4,
                   kNormEscapeWhitespaces = 5;  // the three bools are true by default
constexpr std::string_view kEscapedSpace = "\xE2\x96\x81";  // U+2581

// One field of a protobuf message: its number and either a varint or a length-delimited body
// (fixed-width values are skipped: none of the fields read has one).
struct Field {
  uint32_t number = 0;
  uint64_t varint = 0;
  std::string_view bytes;
};

bool read_varint(std::string_view& in, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const auto b = static_cast<uint8_t>(in.front());
    in.remove_prefix(1);
    v |= uint64_t(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// Calls fn for each field of `message`; false if the bytes are not a well-formed message.
bool for_each_field(std::string_view message, const std::function<void(const Field&)>& fn) {
  while (!message.empty()) {
    uint64_t tag = 0;
    if (!read_varint(message, tag)) return false;
    Field f;
    f.number = static_cast<uint32_t>(tag >> 3);
    switch (tag & 7) {
      case 0:
        if (!read_varint(message, f.varint)) return false;
        break;
      case 1:
      case 5: {
        const size_t n = (tag & 7) == 1 ? 8 : 4;
        if (message.size() < n) return false;
        message.remove_prefix(n);
        continue;
      }
      case 2: {
        uint64_t n = 0;
        if (!read_varint(message, n) || n > message.size()) return false;
        f.bytes = message.substr(0, n);
        message.remove_prefix(n);
        break;
      }
      default:
        return false;  // groups: not used by ModelProto
    }
    fn(f);
  }
  return true;
}

// Marks the pairs of ASCII characters (U+2581 read as ' ') that follow each other in `piece`.
void mark_joined_pairs(std::string_view piece, std::array<std::bitset<128>, 128>& joined) {
  int prev = -1;  // the previous character if ASCII (or U+2581), else -1
  for (size_t i = 0; i < piece.size();) {
    int c = -1;
    if (piece.substr(i).starts_with(kEscapedSpace)) {
      c = ' ';
      i += kEscapedSpace.size();
    } else {
      if (static_cast<unsigned char>(piece[i]) < 0x80) c = piece[i];
      ++i;
      while (i < piece.size() && (static_cast<unsigned char>(piece[i]) & 0xC0) == 0x80) ++i;
    }
    if (prev >= 0 && c >= 0) joined[prev][c] = true;
    prev = c;
  }
}

}  // namespace

WordSplit word_split(std::string_view model_proto) {
  WordSplit split;
  std::string refusal;
  auto refuse = [&](std::string why) {
    if (refusal.empty()) refusal = std::move(why);
  };
  std::string_view trainer, normalizer;
  bool pieces_ok = true;
  const bool parsed = for_each_field(model_proto, [&](const Field& f) {
    if (f.number == kModelTrainerSpec) trainer = f.bytes;
    if (f.number == kModelNormalizerSpec) normalizer = f.bytes;
    if (f.number != kModelPieces) return;
    std::string_view piece;
    uint64_t type = 1;
    pieces_ok &= for_each_field(f.bytes, [&](const Field& p) {
      if (p.number == kPiecePiece) piece = p.bytes;
      if (p.number == kPieceType) type = p.varint;
    });
    mark_joined_pairs(piece, split.joined);  // every piece, whatever its type: the safe side
    if (type == kPieceTypeUserDefined) refuse("it has user-defined pieces (\"" + std::string(piece) + "\")");
    if (piece.find(kEscapedSpace, 1) != std::string_view::npos)
      refuse("its piece \"" + std::string(piece) + "\" holds a space after its start");
  });
  if (!parsed || !pieces_ok) refusal = "its model file could not be read as a ModelProto";

  uint64_t model_type = 1, split_by_whitespace = 1, whitespace_suffix = 0, byte_fallback = 0;
  for_each_field(trainer, [&](const Field& f) {
    if (f.number == kTrainerModelType) model_type = f.varint;
    if (f.number == kTrainerSplitByWhitespace) split_by_whitespace = f.varint;
    if (f.number == kTrainerTreatWhitespaceAsSuffix) whitespace_suffix = f.varint;
    if (f.number == kTrainerByteFallback) byte_fallback = f.varint;
  });
  std::string_view name, charsmap;
  uint64_t dummy_prefix = 1, remove_whitespace = 1, escape_whitespace = 1;
  for_each_field(normalizer, [&](const Field& f) {
    if (f.number == kNormName) name = f.bytes;
    if (f.number == kNormCharsmap) charsmap = f.bytes;
    if (f.number == kNormAddDummyPrefix) dummy_prefix = f.varint;
    if (f.number == kNormRemoveExtraWhitespaces) remove_whitespace = f.varint;
    if (f.number == kNormEscapeWhitespaces) escape_whitespace = f.varint;
  });
  // Checked in this order so that the message names the most telling difference first.
  std::string why;
  if (model_type != kModelTypeBpe) why = "it is not a BPE model";
  else if (name != "identity" || !charsmap.empty()) why = "its normalization is \"" + std::string(name) + "\", not identity";
  else if (dummy_prefix) why = "it adds a dummy prefix";
  else if (remove_whitespace) why = "it removes extra whitespace";
  else if (!escape_whitespace) why = "it does not escape spaces";
  else if (whitespace_suffix) why = "it treats whitespace as a suffix";
  else if (!split_by_whitespace) why = "it was trained without split_by_whitespace";
  else if (!byte_fallback) why = "it has no byte fallback (unknown characters become <unk>)";
  split.refusal = !parsed || !pieces_ok || why.empty() ? refusal : why;
  if (!split.refusal.empty())
    for (auto& row : split.joined) row.set();
  return split;
}

}  // namespace atl
