// Replays every fuzz target (tests/fuzz/<name>_fuzz.cc, built in through fuzz_target.h) over its
// committed seed corpus (tests/fuzz/corpus/<name>/) and every input that ever crashed it
// (tests/fuzz/regressions/<name>/), in every build: the parsers' fixes stay tested without
// clang or libFuzzer. A failure names the target and the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "atoll/atoll_config.h"
#include "fuzz/fuzz_target.h"

namespace fs = std::filesystem;

namespace {

fs::path fuzz_dir() {
  const char* src = std::getenv("ATOLL_SOURCE_DIR");
  return fs::path(src && *src ? src : ATOLL_SOURCE_DIR) / "tests" / "fuzz";
}

std::vector<std::string> target_names() {
  std::vector<std::string> names;
  for (const auto& [name, body] : atl::fuzz::targets()) names.push_back(name);
  return names;
}

std::vector<fs::path> inputs(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

class FuzzReplay : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzReplay, CorpusAndRegressions) {
  const std::string name = GetParam();
  const atl::fuzz::Body body = atl::fuzz::targets().at(name);
  const std::vector<fs::path> corpus = inputs(fuzz_dir() / "corpus" / name);
  EXPECT_FALSE(corpus.empty()) << "no seed corpus in " << (fuzz_dir() / "corpus" / name);
  std::vector<fs::path> all = corpus;
  for (const fs::path& p : inputs(fuzz_dir() / "regressions" / name)) all.push_back(p);
  for (const fs::path& p : all) {
    SCOPED_TRACE(p.string());
    std::ifstream in(p, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // A crash ends the test binary; a foreign exception fails here, naming the file.
    EXPECT_NO_THROW(body(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzReplay, ::testing::ValuesIn(target_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
