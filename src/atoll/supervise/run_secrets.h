// The secrets of a run that `atoll launch` makes (docs/islands.md "Trust at the door"): the run
// token every worker presents to join (RUN_DIR/run.token) and the password of the launcher's own
// redis-server (RUN_DIR/store.password). Each is 32 random bytes from the kernel, as 64 hex
// digits, in a file of mode 0600, so only the run's owner reads them; workers get them through
// their environment (ATOLL_RUN_TOKEN, ATOLL_STORE_PASSWORD), never on a command line that `ps`
// shows to every user.
#pragma once

#include <string>

namespace atl {

// 32 bytes from /dev/urandom as 64 lowercase hex digits.
std::string random_secret();

// Writes `secret` and a newline to `path`, mode 0600 (an existing file is replaced and its mode set).
void write_secret_file(const std::string& path, const std::string& secret);

// The secret in `path`, trailing white space removed. A missing, unreadable or empty file is a
// ConfigError naming the file and `flag` (the option that named it) with the fix.
std::string read_secret_file(const std::string& path, const std::string& flag);

}  // namespace atl
