#include "atoll/ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "atoll/core/errors.h"
#include "ckpt/ckpt_test_util.h"

namespace atl {
namespace {

using testing::has;
using testing::ScratchDir;

// A file with a hand-written header and `data_bytes` zero bytes of data, for malformed cases.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes, uint64_t claimed_len = 0) {
  uint64_t n = claimed_len ? claimed_len : header.size();
  std::ofstream f(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
  f << header << std::string(data_bytes, '\0');
}

std::string corrupt_error(const std::string& path) {
  try {
    SafetensorsReader::open(path);
  } catch (const CorruptCheckpoint& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Safetensors, RoundTripKeepsNamesShapesBytesAndMetadata) {
  ScratchDir dir;
  std::vector<float> a = testing::pattern(6, 1);
  std::vector<uint16_t> b = {0x3f80, 0xbf80, 0x4000};  // bf16 raw bits of 1, -1, 2
  std::vector<int32_t> c = {7, -8, 9};
  std::vector<TensorToWrite> ts = {
      {"a", "F32", {2, 3}, a.data(), a.size() * 4},
      {"b", "BF16", {3}, b.data(), b.size() * 2},
      {"c", "I32", {3, 1}, c.data(), c.size() * 4},
      {"empty", "F32", {0, 5}, nullptr, 0},
  };
  auto where = write_safetensors(dir / "t.safetensors", ts, {.metadata = {{"format", "pt"}}});
  ASSERT_EQ(where.size(), 4u);

  auto r = SafetensorsReader::open(dir / "t.safetensors");
  EXPECT_EQ(r.header().data_start % 8, 0u);  // header padded to 8-byte alignment
  EXPECT_EQ(r.header().metadata.at("format"), "pt");
  ASSERT_EQ(r.header().tensors.size(), 4u);
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorInFile* t = r.find(ts[i].name);
    ASSERT_NE(t, nullptr) << ts[i].name;
    EXPECT_EQ(t->dtype, ts[i].dtype);
    EXPECT_EQ(t->shape, ts[i].shape);
    EXPECT_EQ(t->file_offset, where[i].file_offset);
    auto v = r.view(ts[i].name);
    ASSERT_EQ(v.size(), ts[i].bytes);
    if (ts[i].bytes) {
      EXPECT_EQ(std::memcmp(v.data(), ts[i].data, ts[i].bytes), 0) << ts[i].name;
    }
  }
  std::vector<float> back(6);
  r.copy_to("a", "F32", {2, 3}, back.data());
  EXPECT_EQ(back, a);
  try {
    r.copy_to("a", "F32", {3, 2}, back.data());
    FAIL() << "shape mismatch not reported";
  } catch (const CorruptCheckpoint& e) {
    EXPECT_TRUE(has(e.what(), "tensor 'a'") && has(e.what(), "[2, 3]") && has(e.what(), "t.safetensors")) << e.what();
  }
}

TEST(Safetensors, WriterRejectsBytesThatDoNotMatchTheShape) {
  ScratchDir dir;
  float x[4] = {};
  EXPECT_ANY_THROW(write_safetensors(dir / "bad.safetensors", {{"x", "F32", {5}, x, 16}}));
  EXPECT_ANY_THROW(write_safetensors(dir / "bad.safetensors", {{"x", "Q4", {4}, x, 16}}));
  EXPECT_ANY_THROW(write_safetensors(dir / "bad.safetensors", {{"x", "F32", {4}, x, 16}, {"x", "F32", {4}, x, 16}}));
}

TEST(Safetensors, HeaderLengthBeyondFileSize) {
  ScratchDir dir;
  write_raw(dir / "h.safetensors", "{}", 0, /*claimed_len=*/1000);
  std::string e = corrupt_error(dir / "h.safetensors");
  EXPECT_TRUE(has(e, "h.safetensors") && has(e, "header length 1000")) << e;
  std::ofstream(dir / "short.safetensors") << "abc";
  e = corrupt_error(dir / "short.safetensors");
  EXPECT_TRUE(has(e, "short.safetensors") && has(e, "too short")) << e;
}

TEST(Safetensors, MalformedHeadersNameTheTensor) {
  ScratchDir dir;
  struct Case {
    std::string header;
    size_t data;
    std::string expect;
  };
  std::vector<Case> cases = {
      {"not json", 0, "not a JSON object"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, "tensor 'w': data_offsets [0, 16] lie outside"},
      {R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "tensor 'w': 8 bytes do not match dtype F32 x shape [3]"},
      {R"({"w":{"dtype":"X9","shape":[2],"data_offsets":[0,8]}})", 8, "tensor 'w': unknown dtype"},
      {R"({"w":{"dtype":"F32","shape":[2]}})", 8, "tensor 'w' has no data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "tensor 'w': shape holds -2"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "tensor 'b' overlaps"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "hole of 4 bytes before tensor 'a'"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8, "4 bytes after the last tensor"},
      {R"({"__metadata__":{"k":1}})", 0, "__metadata__.k is not a string"},
      // A JSON object keeps the last of two equal keys: the first tensor would vanish unseen.
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       4, "tensor 'a' is named twice"},
      // Element counts whose byte size overflows 64 bits, or a size past int64.
      {R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", 0,
       "0 bytes do not match dtype F32"},
      {R"({"a":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})", 0, "do not match dtype U8"},
  };
  for (const auto& c : cases) {
    write_raw(dir / "m.safetensors", c.header, c.data);
    std::string e = corrupt_error(dir / "m.safetensors");
    EXPECT_TRUE(has(e, c.expect) && has(e, "m.safetensors")) << "header " << c.header << "\n  gave: " << e;
  }
}

TEST(Safetensors, TruncatedFileNamesTheCutTensor) {
  ScratchDir dir;
  std::vector<float> a = testing::pattern(8, 1), b = testing::pattern(8, 2);
  write_safetensors(dir / "t.safetensors", {{"a", "F32", {8}, a.data(), 32}, {"b", "F32", {2, 4}, b.data(), 32}});
  std::filesystem::resize_file(dir / "t.safetensors", std::filesystem::file_size(dir / "t.safetensors") - 5);
  std::string e = corrupt_error(dir / "t.safetensors");
  EXPECT_TRUE(has(e, "t.safetensors") && has(e, "tensor 'b'") && has(e, "truncated")) << e;
}

}  // namespace
}  // namespace atl
