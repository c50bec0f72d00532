#include "fuzz/fuzz_target.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace atl::fuzz {
namespace fs = std::filesystem;

std::string scratch_dir() {
  // Never destroyed: the exit handler that removes the folder runs after static destructors.
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    fs::path d = fs::path(tmp && *tmp ? tmp : "/tmp") / ("atoll-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(*dir, ec);
    });
    return new std::string(d.string());
  }();
  return *dir;
}

std::string scratch_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace atl::fuzz
