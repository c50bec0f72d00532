#include "atoll/ckpt/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "atoll/ckpt/file_io.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"

namespace atl {
namespace {

// The spec caps the header at 100 MB so a corrupt length cannot make a reader allocate
// without bound.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

[[noreturn]] void corrupt(const std::string& path, const std::string& problem) {
  throw CorruptCheckpoint("corrupt safetensors file " + path + ": " + problem +
                          "; fix: rewrite the file (for a checkpoint: resume from an older one)");
}

// numel(shape) * elem, or false on overflow.
bool byte_size(const std::vector<int64_t>& shape, size_t elem, size_t* out) {
  size_t n = elem;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<size_t>(d), &n)) return false;
  }
  *out = n;
  return true;
}

std::vector<int64_t> parse_shape(const nlohmann::json& j, const std::string& path, const std::string& name) {
  if (!j.is_array()) corrupt(path, "tensor '" + name + "': shape is not an array");
  std::vector<int64_t> shape;
  for (auto& d : j) {
    if (!d.is_number_unsigned()) corrupt(path, "tensor '" + name + "': shape holds " + d.dump() + ", not a size");
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

TensorInFile parse_entry(const std::string& name, const nlohmann::json& j, size_t data_start,
                         size_t data_bytes, const std::string& path) {
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key)) corrupt(path, "tensor '" + name + "' has no " + key);
    return j.at(key);
  };
  TensorInFile t;
  t.name = name;
  const auto& dtype = field("dtype");
  if (!dtype.is_string() || safetensors_dtype_size(dtype.get<std::string>()) == 0)
    corrupt(path, "tensor '" + name + "': unknown dtype " + dtype.dump());
  t.dtype = dtype.get<std::string>();
  t.shape = parse_shape(field("shape"), path, name);
  const auto& off = field("data_offsets");
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    corrupt(path, "tensor '" + name + "': data_offsets must be [begin, end], got " + off.dump());
  t.begin = off[0].get<size_t>();
  t.end = off[1].get<size_t>();
  if (t.begin > t.end || t.end > data_bytes)
    corrupt(path, "tensor '" + name + "': data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                      "] lie outside the " + std::to_string(data_bytes) + " data bytes (truncated file?)");
  size_t want = 0;
  if (!byte_size(t.shape, safetensors_dtype_size(t.dtype), &want) || want != t.bytes())
    corrupt(path, "tensor '" + name + "': " + std::to_string(t.bytes()) + " bytes do not match dtype " + t.dtype +
                      " x shape " + shape_string(t.shape));
  t.file_offset = data_start + t.begin;
  return t;
}

// The spec requires the tensors to tile the data area exactly: no overlap, no holes, nothing
// after the last one. Checking it catches overlapping offsets and trailing garbage alike.
void check_tiling(std::vector<TensorInFile>& ts, size_t data_bytes, const std::string& path) {
  std::sort(ts.begin(), ts.end(), [](auto& a, auto& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  size_t pos = 0;
  for (auto& t : ts) {
    if (t.begin < pos) corrupt(path, "tensor '" + t.name + "' overlaps the tensor before it");
    if (t.begin > pos) corrupt(path, "hole of " + std::to_string(t.begin - pos) + " bytes before tensor '" + t.name + "'");
    pos = t.end;
  }
  if (pos != data_bytes)
    corrupt(path, std::to_string(data_bytes - pos) + " bytes after the last tensor (the header does not index them)");
}

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U8", 1},  {"U16", 2},  {"U32", 4}, {"U64", 8}, {"BOOL", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<TensorInFile> write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                            const SafetensorsWriteOptions& opts) {
  // ordered_json keeps the header in data order, which makes files easy to read by eye.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!opts.metadata.empty()) header["__metadata__"] = opts.metadata;
  std::vector<TensorInFile> out;
  std::set<std::string> seen;
  size_t pos = 0;
  for (const auto& t : tensors) {
    size_t want = 0;
    const size_t elem = safetensors_dtype_size(t.dtype);
    ATOLL_CHECK(elem != 0) << "tensor '" << t.name << "': unknown dtype " << t.dtype;
    ATOLL_CHECK(byte_size(t.shape, elem, &want) && want == t.bytes)
        << "tensor '" << t.name << "': " << t.bytes << " bytes for " << t.dtype << " x " << shape_string(t.shape);
    ATOLL_CHECK(t.name != "__metadata__" && seen.insert(t.name).second) << "duplicate or reserved name " << t.name;
    ATOLL_CHECK(t.data != nullptr || t.bytes == 0) << "tensor '" << t.name << "' has no data";
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {pos, pos + t.bytes}}};
    out.push_back({t.name, t.dtype, t.shape, pos, pos + t.bytes, 0});
    pos += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  for (auto& t : out) t.file_offset = 8 + text.size() + t.begin;

  FileWriter w(path);
  w.write(len, 8);
  w.write(text.data(), text.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    w.write(tensors[i].data, tensors[i].bytes);
    if (opts.after_tensor) opts.after_tensor(i);
  }
  if (opts.fsync) w.sync();
  w.close();
  return out;
}

const TensorInFile* SafetensorsHeader::find(const std::string& name) const {
  for (auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> head, size_t file_size, const std::string& path) {
  if (file_size < 8) corrupt(path, "file is " + std::to_string(file_size) + " bytes, too short for the header length");
  ATOLL_CHECK_GE(head.size(), size_t(8));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(std::to_integer<unsigned char>(head[i])) << (8 * i);
  if (n > file_size - 8 || n > kMaxHeaderBytes)
    corrupt(path, "header length " + std::to_string(n) + " is beyond the file size " + std::to_string(file_size) +
                      " (truncated or not a safetensors file)");
  ATOLL_CHECK_GE(head.size(), 8 + n) << "caller must pass the whole header";
  SafetensorsHeader h;
  h.data_start = 8 + n;
  const size_t data_bytes = file_size - h.data_start;
  const char* text = reinterpret_cast<const char*>(head.data()) + 8;
  // A JSON object keeps the last of two equal keys; the header's names must be unique, so the
  // parse watches the top level's keys for a repeat.
  std::set<std::string> names;
  std::string repeated;
  const auto watch = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && !names.insert(parsed.get<std::string>()).second &&
        repeated.empty())
      repeated = parsed.get<std::string>();
    return true;
  };
  nlohmann::json j = nlohmann::json::parse(text, text + n, watch, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) corrupt(path, "header is not a JSON object");
  if (!repeated.empty()) corrupt(path, "tensor '" + repeated + "' is named twice in the header");
  for (auto& [name, value] : j.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) corrupt(path, "__metadata__ is not an object");
      for (auto& [k, v] : value.items()) {
        if (!v.is_string()) corrupt(path, "__metadata__." + k + " is not a string");
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(name, value, h.data_start, data_bytes, path));
  }
  check_tiling(h.tensors, data_bytes, path);
  return h;
}

SafetensorsReader SafetensorsReader::open(const std::string& path) {
  SafetensorsReader r;
  r.path_ = path;
  r.bytes_ = read_file_bytes(path);
  r.header_ = parse_safetensors_header(r.bytes_, r.bytes_.size(), path);
  return r;
}

std::span<const std::byte> SafetensorsReader::view(const std::string& name) const {
  const TensorInFile* t = find(name);
  if (!t) corrupt(path_, "no tensor named '" + name + "'");
  return std::span<const std::byte>(bytes_).subspan(t->file_offset, t->bytes());
}

void SafetensorsReader::copy_to(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
                                void* dst) const {
  const TensorInFile* t = find(name);
  if (!t) corrupt(path_, "no tensor named '" + name + "'");
  if (t->dtype != dtype || t->shape != shape)
    corrupt(path_, "tensor '" + name + "' is " + t->dtype + " " + shape_string(t->shape) + ", expected " + dtype + " " +
                       shape_string(shape));
  if (t->bytes() > 0) std::memcpy(dst, bytes_.data() + t->file_offset, t->bytes());
}

}  // namespace atl
