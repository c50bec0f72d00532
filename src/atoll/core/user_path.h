// Paths a user gives (a flag, a config key, an entry of a list) are checked for what they name
// before anything opens them, through this one helper. A named pipe or a socket would block the
// first read forever, a device such as /dev/zero streams without end, and std::filesystem's own
// errors name neither the flag nor the fix. Each check looks with stat(2) and access(2), which
// never open the path, and throws PathError with one line: where the path came from (`what`: a
// flag "--input", a key "data.mix[1].dir"), the path, what it is, and the fix.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "atoll/core/errors.h"

namespace atl {

class PathError : public Error {  // a path given by the user names the wrong kind of thing
 public:
  using Error::Error;
};

enum class PathKind {
  kMissing,      // nothing there (or a dangling symlink)
  kFile,         // a regular file
  kFolder,
  kPipe,         // a named pipe (FIFO), or a pipe passed as /dev/fd/N or /dev/stdin
  kSocket,
  kCharDevice,   // /dev/zero, /dev/null, a terminal
  kBlockDevice,
  kNoAccess,     // a folder on the way cannot be searched (EACCES)
  kLoop,         // too many levels of symbolic links
  kNotFolderOnTheWay,  // a file where a folder of the path should be (ENOTDIR)
  kOther,        // any other error of stat(2)
};

// What `path` names, following symlinks; never opens it.
PathKind path_kind(const std::string& path);

// "a named pipe", "a character device", "a folder", "missing"...: for messages.
std::string path_kind_text(PathKind kind);

// `path` must be a regular file this process can read (a config, a tokenizer, a token file).
void check_input_file(const std::string& path, const std::string& what, const std::string& fix = "");

// `path` must be a folder this process can list (a checkpoint, a prepared dataset).
void check_input_dir(const std::string& path, const std::string& what, const std::string& fix = "");

// `path` must be a readable regular file or a listable folder (a text input, a shard or a folder
// of shards).
void check_input_file_or_dir(const std::string& path, const std::string& what, const std::string& fix = "");

// `path` is where a folder will be written: a folder, or nothing yet under a folder that exists
// or can be made (its nearest existing ancestor a folder). Never a file, a pipe or a device.
void check_output_dir(const std::string& path, const std::string& what, const std::string& fix = "");

// A path as a key for "do these two spellings name the same thing": the device and inode of
// what exists, else the absolute, normalised path ("data/a", "./data/a/" and a symlink to it
// give one key).
std::string path_identity(const std::string& path);

// Entries of one list that name the same file or folder: throws PathError naming both entries
// (their keys and spellings). `entries` are {key, path}, e.g. {"data.input[2]", "./a/"}.
struct PathEntry {
  std::string key, path;
};
void check_distinct_paths(const std::vector<PathEntry>& entries, const std::string& fix);

// The entries of a list as check_distinct_paths takes them: a key's are "data.input[0]",
// "data.input[1]"...; a repeated flag's ("--input") are each the flag.
std::vector<PathEntry> list_entries(const std::string& key, const std::vector<std::string>& paths);

// The one line for a std::filesystem error that reached the command line's boundary: the
// operation, the path(s) and the system's reason, with a fix, never the library's raw text.
std::string filesystem_error_line(const std::filesystem::filesystem_error& e);

}  // namespace atl
