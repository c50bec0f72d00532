// Temporary names of interrupted writes: a folder written as "<name>.tmp-<pid>" and renamed to
// "<name>" when complete (checkpoints, exports) is left behind when its writer is killed. Its
// pid says whether the writer can still finish it: once that process has ended, nobody will, and
// the next writer removes it (a large export's model would otherwise fill the disk for good).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace atl {

// The number in a name "<base>.tmp-<digits>" (base not empty, at most 18 digits): the writer's
// pid, or a checkpoint's save token (ckpt/checkpoint.h); nullopt for any other name.
std::optional<int64_t> temp_owner(const std::string& name);

// Whether a process with this pid exists (one of another user counts: kill(2) says EPERM); a
// number that cannot be a pid is no process.
bool process_alive(int64_t pid);

// Removes the entries "<base>.tmp-<pid>" of `dir` whose process has ended, logging each as left by
// an interrupted `what` ("export"); returns the paths removed. Entries it cannot remove are
// logged and left.
std::vector<std::string> remove_stale_temps(const std::string& dir, const std::string& base, const std::string& what);

}  // namespace atl
