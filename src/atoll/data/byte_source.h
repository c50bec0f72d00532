// Reading an input file as a stream of bytes, decompressing on the fly: `.gz` through zlib,
// `.zst` through libzstd, anything else as it is (extensions in any case). Memory is a fixed
// buffer per open file whatever the file's size, so a corpus of any size streams through.
//
// A compressed file that ends in the middle of its data (a truncated download, a copy cut
// short) is not an error: the bytes decoded up to the cut are delivered, then truncated()
// turns true so the caller can say what was lost. Corrupt compressed data (bad magic, a
// checksum mismatch) throws DataError naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace atl {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Up to `n` decoded bytes into `out`; 0 only at the end of the file.
  virtual size_t read(char* out, size_t n) = 0;
  // Bytes consumed from the file on disk so far (compressed bytes for .gz / .zst).
  virtual int64_t disk_bytes() const = 0;
  // The compressed stream ended before its last frame was complete.
  virtual bool truncated() const { return false; }
};

enum class Compression { kNone, kGzip, kZstd };
Compression compression_of(const std::string& path);  // by extension, any case

// Opens `path`; throws IoError when it cannot be opened.
std::unique_ptr<ByteSource> open_byte_source(const std::string& path);

}  // namespace atl
