#include "atoll/data/byte_source.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "atoll/core/errors.h"

namespace atl {

namespace {

constexpr size_t kDiskChunk = 1 << 20;

// The file on disk, read in chunks.
class RawFile {
 public:
  explicit RawFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw IoError("cannot read input " + path + ": " + std::strerror(errno) + "; fix: check the path and its permissions");
  }
  ~RawFile() { ::close(fd_); }
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;
  size_t read(char* out, size_t n) {
    while (true) {
      const ssize_t got = ::read(fd_, out, n);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw IoError("error while reading input " + path_ + ": " + std::strerror(errno));
      bytes_ += got;
      return static_cast<size_t>(got);
    }
  }
  int64_t bytes() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t bytes_ = 0;
};

class PlainSource : public ByteSource {
 public:
  explicit PlainSource(const std::string& path) : file_(path) {}
  size_t read(char* out, size_t n) override { return file_.read(out, n); }
  int64_t disk_bytes() const override { return file_.bytes(); }

 private:
  RawFile file_;
};

// gzip (and zlib) streams, several members one after another as `cat a.gz b.gz` makes them.
class GzipSource : public ByteSource {
 public:
  explicit GzipSource(const std::string& path) : file_(path), in_(kDiskChunk) {
    std::memset(&z_, 0, sizeof z_);
    if (inflateInit2(&z_, 15 + 32) != Z_OK) throw DataError("zlib: cannot start decoding " + path);
  }
  ~GzipSource() override { inflateEnd(&z_); }
  size_t read(char* out, size_t n) override {
    z_.next_out = reinterpret_cast<Bytef*>(out);
    z_.avail_out = static_cast<uInt>(n);
    while (z_.avail_out == n) {
      if (z_.avail_in == 0 && !eof_) {
        const size_t got = file_.read(in_.data(), in_.size());
        eof_ = got == 0;
        z_.next_in = reinterpret_cast<Bytef*>(in_.data());
        z_.avail_in = static_cast<uInt>(got);
      }
      if (eof_ && z_.avail_in == 0 && !in_member_) break;  // clean end after a whole member
      in_member_ = true;
      const uInt before = z_.avail_out;
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        in_member_ = false;
        inflateReset(&z_);  // another member may follow
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        throw DataError("input " + file_.path() + ": corrupt gzip data after " + std::to_string(file_.bytes()) +
                        " bytes (" + (z_.msg ? z_.msg : "zlib error " + std::to_string(rc)) +
                        "); fix: re-download or re-compress it, or remove it from the inputs");
      } else if (eof_ && z_.avail_in == 0 && z_.avail_out == before) {
        truncated_ = true;  // the file ended inside a member
        break;
      }
    }
    return n - z_.avail_out;
  }
  int64_t disk_bytes() const override { return file_.bytes(); }
  bool truncated() const override { return truncated_; }

 private:
  RawFile file_;
  std::vector<char> in_;
  z_stream z_;
  bool in_member_ = false, eof_ = false, truncated_ = false;
};

class ZstdSource : public ByteSource {
 public:
  explicit ZstdSource(const std::string& path) : file_(path), in_(kDiskChunk), ctx_(ZSTD_createDStream()) {
    if (!ctx_) throw DataError("zstd: cannot start decoding " + path);
    ZSTD_initDStream(ctx_);
  }
  ~ZstdSource() override { ZSTD_freeDStream(ctx_); }
  size_t read(char* out, size_t n) override {
    ZSTD_outBuffer o{out, n, 0};
    while (o.pos == 0) {
      if (in_buf_.pos == in_buf_.size && !eof_) {
        const size_t got = file_.read(in_.data(), in_.size());
        eof_ = got == 0;
        in_buf_ = ZSTD_inBuffer{in_.data(), got, 0};
      }
      const size_t before = in_buf_.pos;
      // At the end of the file this call still flushes what zstd holds decoded.
      const size_t hint = ZSTD_decompressStream(ctx_, &o, &in_buf_);
      if (ZSTD_isError(hint)) {
        hint_ = hint;
        throw DataError("input " + file_.path() + ": corrupt zstd data after " + std::to_string(file_.bytes()) +
                        " bytes (" + ZSTD_getErrorName(hint_) +
                        "); fix: re-download or re-compress it, or remove it from the inputs");
      }
      if (eof_ && o.pos == 0 && in_buf_.pos == before) {
        // The last call that made progress did not end a frame: the file is cut inside one.
        // (A call without progress after a whole frame asks for the next frame's header.)
        truncated_ = hint_ != 0;
        break;
      }
      hint_ = hint;
    }
    return o.pos;
  }
  int64_t disk_bytes() const override { return file_.bytes(); }
  bool truncated() const override { return truncated_; }

 private:
  RawFile file_;
  std::vector<char> in_;
  ZSTD_DStream* ctx_;
  ZSTD_inBuffer in_buf_{nullptr, 0, 0};
  size_t hint_ = 0;
  bool eof_ = false, truncated_ = false;
};

}  // namespace

Compression compression_of(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".gz") return Compression::kGzip;
  if (ext == ".zst") return Compression::kZstd;
  return Compression::kNone;
}

std::unique_ptr<ByteSource> open_byte_source(const std::string& path) {
  switch (compression_of(path)) {
    case Compression::kGzip:
      return std::make_unique<GzipSource>(path);
    case Compression::kZstd:
      return std::make_unique<ZstdSource>(path);
    case Compression::kNone:
      break;
  }
  return std::make_unique<PlainSource>(path);
}

}  // namespace atl
