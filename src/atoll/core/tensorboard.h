// TensorBoard event files, written natively: `tensorboard --logdir`, W&B's sync_tensorboard and
// Aim's converter read them. An event file is a sequence of TFRecords, each
//   uint64 length (little endian), uint32 masked CRC-32C of those 8 bytes,
//   `length` bytes of data, uint32 masked CRC-32C of the data,
// where masked(c) = ((c >> 15) | (c << 17)) + 0xA282EAD8 (mod 2^32), and each record's data is
// one protobuf `Event` message (tensorflow/core/util/event.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2" and no summary. The messages are a few
// fields, so they are encoded here by hand (varints, fixed 32/64-bit values, length-delimited
// bytes); no protobuf library is needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "atoll/core/file_writer.h"

namespace atl {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), and its TFRecord mask.
uint32_t crc32c(const void* data, size_t bytes);
uint32_t masked_crc32c(const void* data, size_t bytes);

// One framed record around `data`.
std::string tfrecord(const std::string& data);

struct TbScalar {
  std::string tag;
  float value = 0;
};
// The Event message of one step's scalars (no file_version).
std::string tb_scalars_event(double wall_time, int64_t step, const std::vector<TbScalar>& scalars);

// An event file DIR/events.out.tfevents.<seconds>.<host>.<pid><suffix>, created with its folder
// (seconds: `created`, seconds since 1970); each add() appends one record with one write(2), so a
// reader sees whole records at every log step. I/O errors are IoError (core/file_writer.h).
class TbWriter {
 public:
  TbWriter() = default;  // writes nothing
  TbWriter(const std::string& dir, double created, const std::string& suffix = "");

  void add(int64_t step, const std::vector<TbScalar>& scalars, double wall_time);
  const std::string& path() const { return file_.path(); }

 private:
  void append(const std::string& record) { file_.append(record.data(), record.size()); }
  AppendFile file_;
};

}  // namespace atl
