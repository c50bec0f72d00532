// metrics.jsonl and events.jsonl (DESIGN.md "Files"): one JSON object per line, each line
// written with a single append so lines from several processes never interleave.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace atl {

class JsonlWriter {
 public:
  JsonlWriter() = default;
  explicit JsonlWriter(const std::string& path);  // opens for appending, creating it
  ~JsonlWriter();
  JsonlWriter(JsonlWriter&&) noexcept;
  JsonlWriter& operator=(JsonlWriter&&) noexcept;

  void write(const nlohmann::json& row);  // one line, one write(2)
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Keeps only the lines of a JSONL file whose "step" is at most max_step (and lines without a
// step), rewriting it through a temporary file: a resumed run drops what the killed run logged
// after its last checkpoint, so the file reads as one uninterrupted run.
void truncate_jsonl_after_step(const std::string& path, int64_t max_step);

}  // namespace atl
