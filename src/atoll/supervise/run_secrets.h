// The secrets of a run that `atoll launch` makes (docs/islands.md "Trust at the door"): the run
// token every worker presents to join (RUN_DIR/run.token) and the password of the launcher's own
// redis-server (RUN_DIR/store.password). Each is 32 random bytes from the kernel, as 64 hex
// digits, in a file of mode 0600, so only the run's owner reads them; workers get them through
// their environment (ATOLL_RUN_TOKEN, ATOLL_STORE_PASSWORD), never on a command line that `ps`
// shows to every user. Beside them, not secret, the run's id (RUN_DIR/run.id): the prefix of the
// run's keys in the store, which a worker started by hand needs to join (`atoll worker --run-dir`
// reads it).
#pragma once

#include <optional>
#include <string>

namespace atl {

// 32 bytes from /dev/urandom as 64 lowercase hex digits.
std::string random_secret();

// Writes `secret` and a newline to `path`, mode 0600 (an existing file is replaced and its mode set).
void write_secret_file(const std::string& path, const std::string& secret);

// The secret in `path`, trailing white space removed. A missing, unreadable or empty file is a
// ConfigError naming the file and `flag` (the option that named it) with the fix.
std::string read_secret_file(const std::string& path, const std::string& flag);

// RUN_DIR/run.id: written by `atoll launch` for each launch (a resume is a new launch, with a new
// id); read_run_id gives nullopt when the folder has none (a run without a launcher).
void write_run_id(const std::string& run_dir, const std::string& run_id);
std::optional<std::string> read_run_id(const std::string& run_dir);

}  // namespace atl
