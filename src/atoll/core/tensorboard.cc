#include "atoll/core/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "atoll/core/file_writer.h"

namespace atl {
namespace {

// The byte-at-a-time table of the reflected CRC-32C polynomial.
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[n] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Protobuf wire format: a key is (field << 3 | wire type); 0 varint, 1 fixed64, 2 bytes, 5 fixed32.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_fixed(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }  // little endian host
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_varint(out, uint64_t(field) << 3 | 2);
  put_varint(out, bytes.size());
  out += bytes;
}
std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_varint(e, 1 << 3 | 1);
  put_fixed(e, &wall_time, 8);
  if (step != 0) {  // proto3 leaves a default out
    put_varint(e, 2 << 3 | 0);
    put_varint(e, uint64_t(step));
  }
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < bytes; ++i) c = kCrc32cTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t bytes) {
  const uint32_t c = crc32c(data, bytes);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

std::string tfrecord(const std::string& data) {
  std::string r;
  const uint64_t n = data.size();
  put_fixed(r, &n, 8);
  const uint32_t len_crc = masked_crc32c(&n, 8), data_crc = masked_crc32c(data.data(), data.size());
  put_fixed(r, &len_crc, 4);
  r += data;
  put_fixed(r, &data_crc, 4);
  return r;
}

std::string tb_scalars_event(double wall_time, int64_t step, const std::vector<TbScalar>& scalars) {
  std::string summary;
  for (const TbScalar& s : scalars) {
    std::string value;
    put_bytes(value, 1, s.tag);
    put_varint(value, 2 << 3 | 5);
    put_fixed(value, &s.value, 4);
    put_bytes(summary, 1, value);
  }
  std::string e = event_header(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

TbWriter::TbWriter(const std::string& dir, double created, const std::string& suffix) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw_io_error("create the folder", dir, ec.value());
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  file_ = AppendFile(dir + "/events.out.tfevents." + std::to_string(int64_t(created)) + "." + host + "." +
                     std::to_string(::getpid()) + suffix);
  std::string first = event_header(created, 0);
  put_bytes(first, 3, "brain.Event:2");
  append(tfrecord(first));
}

void TbWriter::add(int64_t step, const std::vector<TbScalar>& scalars, double wall_time) {
  if (!file_.is_open() || scalars.empty()) return;
  append(tfrecord(tb_scalars_event(wall_time, step, scalars)));
}

}  // namespace atl
