// The safetensors file format (https://huggingface.co/docs/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON header
//   {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string>"}}
// then the raw tensor bytes; data_offsets count from the end of the header. We pad the header
// with spaces so the data starts on an 8-byte boundary, and write tensors back to back in the
// order given (the spec forbids holes in the data area).
//
// Used by checkpoints (one file per writing rank) and by the Hugging Face export.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace atl {

// Bytes per element of a safetensors dtype ("F32", "BF16", "I32", ...); 0 if unknown.
size_t safetensors_dtype_size(const std::string& dtype);

// One tensor to write: `bytes` must equal numel(shape) * dtype size.
struct TensorToWrite {
  std::string name;
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

// Where a tensor lies in a file. `begin`/`end` are relative to the data area, as in the header;
// `file_offset` is absolute (header included), for readers that seek straight to the bytes.
struct TensorInFile {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;
  size_t file_offset = 0;
  size_t bytes() const { return end - begin; }
};

struct SafetensorsWriteOptions {
  std::map<std::string, std::string> metadata;  // "__metadata__"; omitted when empty
  bool fsync = true;                            // flush to disk before returning
  // Called after each tensor's bytes are written (its index in `tensors`), before the fsync:
  // where a crash test kills a writer in the middle of a file (core/fault_injection.h).
  std::function<void(size_t)> after_tensor{};
};

// Writes `path` (created or truncated). Returns where each tensor went, in input order.
// Throws IoError on any failed system call; ATOLL_CHECK on malformed input (bytes/shape
// mismatch, unknown dtype, duplicate names).
std::vector<TensorInFile> write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                            const SafetensorsWriteOptions& opts = {});

// Parses and validates the header of a safetensors file of `file_size` bytes whose first
// bytes are `head` (at least 8 + N of them, or fewer if the file is that short). Throws
// CorruptCheckpoint naming `path` and the bad tensor or field: header length beyond the file,
// JSON that does not parse, unknown dtype, bytes not matching dtype x shape, offsets out of
// range, overlapping or leaving holes.
struct SafetensorsHeader {
  std::vector<TensorInFile> tensors;  // sorted by position in the file
  std::map<std::string, std::string> metadata;
  size_t data_start = 0;  // 8 + N
  const TensorInFile* find(const std::string& name) const;
};
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> head, size_t file_size,
                                           const std::string& path);

// A whole file read into memory and validated. Views stay valid while the reader lives.
class SafetensorsReader {
 public:
  // Throws IoError if the file cannot be read, CorruptCheckpoint if it is malformed.
  static SafetensorsReader open(const std::string& path);

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const TensorInFile* find(const std::string& name) const { return header_.find(name); }
  // The bytes of tensor `name`; CorruptCheckpoint naming the file if absent.
  std::span<const std::byte> view(const std::string& name) const;
  // Copies tensor `name` into `dst`, checking its dtype and shape first (CorruptCheckpoint
  // naming the file and tensor on mismatch).
  void copy_to(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
               void* dst) const;

 private:
  std::string path_;
  std::vector<std::byte> bytes_;
  SafetensorsHeader header_;
};

// "[2, 3]" for messages.
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace atl
