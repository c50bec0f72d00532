// One fuzz target per file (tests/fuzz/<name>_fuzz.cc), written once and built two ways:
//   - as a libFuzzer binary fuzz_<name> (ATOLL_FUZZ=ON, clang; ATOLL_LIBFUZZER defined): the
//     body is LLVMFuzzerTestOneInput;
//   - into the GoogleTest fuzz_replay_test of every build (gcc included): the body registers
//     under its name, and the test replays the committed corpus and every input that ever
//     crashed (tests/fuzz/corpus/<name>/, tests/fuzz/regressions/<name>/) through it.
// The contract a body checks: a parser given any bytes returns or throws an atl::Error (a typed
// error naming the file or field); anything else (another exception, a crash, a leak, undefined
// behaviour under the sanitizers) is a bug. fuzz_reject() is that catch, in one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "atoll/core/errors.h"

namespace atl::fuzz {

using Body = int (*)(const uint8_t* data, size_t size);

// Every target of this binary, by name (the replay test's table).
inline std::map<std::string, Body>& targets() {
  static std::map<std::string, Body> t;
  return t;
}

struct Register {
  Register(const char* name, Body body) { targets()[name] = body; }
};

// Runs `parse`; an atl::Error is the parser's rejection of bad bytes, so it is swallowed.
template <typename F>
void fuzz_reject(F&& parse) {
  try {
    parse();
  } catch (const Error&) {
  }
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A scratch folder of this process (removed at exit), for parsers that read files.
std::string scratch_dir();
// Writes `size` bytes to scratch_dir()/name and returns the path.
std::string scratch_file(const std::string& name, const uint8_t* data, size_t size);

}  // namespace atl::fuzz

#ifdef ATOLL_LIBFUZZER
#define ATOLL_FUZZ_TARGET(name)                                                                                        \
  static int atl_fuzz_body_##name(const uint8_t* data, size_t size);                                                   \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return atl_fuzz_body_##name(data, size); } \
  static int atl_fuzz_body_##name(const uint8_t* data, size_t size)
#else
#define ATOLL_FUZZ_TARGET(name)                                                             \
  static int atl_fuzz_body_##name(const uint8_t* data, size_t size);                        \
  static const ::atl::fuzz::Register atl_fuzz_register_##name(#name, atl_fuzz_body_##name); \
  static int atl_fuzz_body_##name(const uint8_t* data, size_t size)
#endif
