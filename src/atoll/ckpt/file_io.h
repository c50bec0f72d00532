// Durable file operations for checkpoints and exports: writes that reach the disk (fsync of
// the file and of its directory) and directory publication by rename, so a crash leaves
// either the old state or the new one, never a half-written directory under the final name.
// Every failure is an IoError naming the path and the system's reason ("disk full" for ENOSPC;
// core/file_writer.h, which also holds FileWriter).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "atoll/core/file_writer.h"

namespace atl {

// Writes `text` to `path`, fsyncs it when `sync`.
void write_text_file(const std::string& path, const std::string& text, bool sync);

// Writes `path` through `path.tmp` and a rename, so readers see the old or the new content;
// on failure the temporary is removed.
void write_text_file_atomic(const std::string& path, const std::string& text);

std::string read_text_file(const std::string& path);           // IoError if unreadable
std::vector<std::byte> read_file_bytes(const std::string& path);  // IoError if unreadable

// Flushes a directory's entries (new names, renames) to disk.
void fsync_dir(const std::string& dir);

// Creates `dir` and its parents if missing.
void make_dirs(const std::string& dir);

// Removes `path` recursively if present.
void remove_all(const std::string& path);

// Moves the finished directory `tmp` to `final_dir`. An existing `final_dir` is first moved
// aside to `<final_dir>.old-<pid>` and removed after the rename, because rename(2) cannot
// replace a non-empty directory. The parent directory is fsynced.
void publish_dir(const std::string& tmp, const std::string& final_dir);

}  // namespace atl
