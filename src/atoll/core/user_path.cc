#include "atoll/core/user_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

namespace atl {
namespace fs = std::filesystem;
namespace {

// `--input x` for a flag, `data.mix[0].dir = "x"` for a key.
std::string named(const std::string& what, const std::string& path) {
  return what.starts_with("-") ? what + " " + path : what + " = \"" + path + "\"";
}

[[noreturn]] void refuse(const std::string& what, const std::string& path, const std::string& problem,
                         const std::string& fix) {
  throw PathError(named(what, path) + ": " + problem + "; fix: " + fix);
}

bool is_special(PathKind k) {
  return k == PathKind::kPipe || k == PathKind::kSocket || k == PathKind::kCharDevice || k == PathKind::kBlockDevice;
}

// The refusals every check shares: a special file (atoll reads inputs more than once, from the
// start, and a pipe or device cannot be read so), a path it cannot reach, a symlink loop.
void refuse_unreachable(PathKind k, const std::string& what, const std::string& path, const std::string& expected,
                        const std::string& fix) {
  if (is_special(k))
    refuse(what, path, "is " + path_kind_text(k) + ", not " + expected +
                           " (atoll never reads from a pipe or device: it would wait forever or read without end)",
           expected != "a folder" ? "write the data to a regular file first (e.g. `cat ... > FILE`) and pass that"
           : fix.empty()          ? "pass a folder"
                                  : fix);
  if (k == PathKind::kNoAccess)
    refuse(what, path, "cannot be reached (permission denied on a folder on the way)",
           "give this user access to the folders on the way (chmod +x), or pass another path");
  if (k == PathKind::kLoop)
    refuse(what, path, "is a symbolic link that loops (too many levels of symbolic links)",
           "point the link at a real file or folder, or pass the path without it");
  if (k == PathKind::kNotFolderOnTheWay)
    refuse(what, path, "has a file where a folder of the path should be", "correct the path");
  if (k == PathKind::kOther) refuse(what, path, "cannot be looked at (" + std::string(std::strerror(errno)) + ")", "check the path");
}

void check_readable(const std::string& what, const std::string& path, bool folder) {
  if (::access(path.c_str(), folder ? (R_OK | X_OK) : R_OK) != 0)
    refuse(what, path, std::string("cannot be read (") + std::strerror(errno) + ")",
           std::string("make it readable (chmod +r") + (folder ? "x" : "") + ") or pass another path");
}

}  // namespace

PathKind path_kind(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    switch (errno) {
      case ENOENT: return PathKind::kMissing;
      case EACCES: return PathKind::kNoAccess;
      case ELOOP: return PathKind::kLoop;
      case ENOTDIR: return PathKind::kNotFolderOnTheWay;
      default: return PathKind::kOther;
    }
  }
  if (S_ISREG(st.st_mode)) return PathKind::kFile;
  if (S_ISDIR(st.st_mode)) return PathKind::kFolder;
  if (S_ISFIFO(st.st_mode)) return PathKind::kPipe;
  if (S_ISSOCK(st.st_mode)) return PathKind::kSocket;
  if (S_ISCHR(st.st_mode)) return PathKind::kCharDevice;
  if (S_ISBLK(st.st_mode)) return PathKind::kBlockDevice;
  return PathKind::kOther;
}

std::string path_kind_text(PathKind kind) {
  switch (kind) {
    case PathKind::kMissing: return "missing";
    case PathKind::kFile: return "a file";
    case PathKind::kFolder: return "a folder";
    case PathKind::kPipe: return "a named pipe";
    case PathKind::kSocket: return "a socket";
    case PathKind::kCharDevice: return "a character device";
    case PathKind::kBlockDevice: return "a block device";
    case PathKind::kNoAccess: return "out of reach";
    case PathKind::kLoop: return "a symbolic link loop";
    case PathKind::kNotFolderOnTheWay: return "under a file";
    case PathKind::kOther: return "unknown";
  }
  return "unknown";
}

namespace {

// What an input check takes: a file, a folder, or either.
void check_input(const std::string& path, const std::string& what, const std::string& fix, bool file, bool folder) {
  const std::string expected = file && folder ? "a regular file or folder" : file ? "a regular file" : "a folder";
  const PathKind k = path_kind(path);
  if (path.empty()) refuse(what, path, "is empty", fix.empty() ? "name " + expected : fix);
  if (k == PathKind::kMissing) refuse(what, path, "does not exist", fix.empty() ? "check the path" : fix);
  if (k == PathKind::kFolder && !folder) refuse(what, path, "is a folder, not a file", fix.empty() ? "pass a file" : fix);
  if (k == PathKind::kFile && !file) refuse(what, path, "is a file, not a folder", fix.empty() ? "pass a folder" : fix);
  refuse_unreachable(k, what, path, expected, fix);
  check_readable(what, path, k == PathKind::kFolder);
}

}  // namespace

void check_input_file(const std::string& path, const std::string& what, const std::string& fix) {
  check_input(path, what, fix, true, false);
}

void check_input_dir(const std::string& path, const std::string& what, const std::string& fix) {
  check_input(path, what, fix, false, true);
}

void check_input_file_or_dir(const std::string& path, const std::string& what, const std::string& fix) {
  check_input(path, what, fix, true, true);
}

void check_output_dir(const std::string& path, const std::string& what, const std::string& fix) {
  const PathKind k = path_kind(path);
  if (path.empty()) refuse(what, path, "is empty", fix.empty() ? "name a folder" : fix);
  if (k == PathKind::kFolder || k == PathKind::kMissing) return;
  const std::string choose = fix.empty() ? "choose another " + what + " (atoll writes a folder there)" : fix;
  if (k == PathKind::kFile) refuse(what, path, "is a file, not a folder", choose);
  if (is_special(k)) refuse(what, path, "is " + path_kind_text(k) + ", not a folder", choose);
  refuse_unreachable(k, what, path, "a folder", fix);
}

std::string path_identity(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return "inode " + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  std::error_code ec;
  fs::path p = fs::absolute(path, ec).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "dir/" -> "dir"
  return "path " + p.string();
}

void check_distinct_paths(const std::vector<PathEntry>& entries, const std::string& fix) {
  std::map<std::string, const PathEntry*> seen;
  for (const PathEntry& e : entries) {
    const auto [it, fresh] = seen.emplace(path_identity(e.path), &e);
    if (fresh) continue;
    const PathEntry& first = *it->second;
    const bool same_spelling = first.path == e.path;
    throw PathError(named(first.key, first.path) + " and " + named(e.key, e.path) + " name the same " +
                    (path_kind(e.path) == PathKind::kFolder ? "folder" : "file") +
                    (same_spelling ? " twice" : " in two spellings") + "; fix: " + fix);
  }
}

std::vector<PathEntry> list_entries(const std::string& key, const std::vector<std::string>& paths) {
  std::vector<PathEntry> entries;
  for (size_t i = 0; i < paths.size(); ++i)
    entries.push_back({key.starts_with("-") ? key : key + "[" + std::to_string(i) + "]", paths[i]});
  return entries;
}

std::string filesystem_error_line(const fs::filesystem_error& e) {
  // what() is "filesystem error: <operation>: <reason> [path1] [path2]".
  std::string op = e.what();
  if (op.starts_with("filesystem error: ")) op.erase(0, 18);
  const std::string reason = e.code().message();
  if (const size_t at = op.find(": " + reason); at != std::string::npos) op.resize(at);
  std::string paths = e.path1().string();
  if (!e.path2().empty()) paths += " (and " + e.path2().string() + ")";
  std::string fix = "check that path: atoll reads regular files and folders, not pipes, devices or vanished paths";
  if (e.code() == std::errc::too_many_symbolic_link_levels)
    fix = "a symbolic link there loops back on a folder above it; remove the link or pass a path without it";
  else if (e.code() == std::errc::permission_denied)
    fix = "give this user access to it (chmod), or pass another path";
  else if (e.code() == std::errc::no_space_on_device)
    fix = "free space on that disk";
  return (paths.empty() ? std::string("a path") : paths) + ": " + op + " (" + reason + "); fix: " + fix;
}

}  // namespace atl
