// A full disk is said as such: every write of a checkpoint (tensor file, manifest, the "latest"
// pointer, an export) that fails names the path and says "disk full" with the fix, rather than
// "cannot write" with no reason; and a failed write leaves no temporary file behind. /dev/full
// (every write fails with ENOSPC) serves where a path is enough; a tiny tmpfs of the test's own
// (small_disk.h) where a real folder must fill up.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/ckpt/export_hf.h"
#include "atoll/ckpt/file_io.h"
#include "atoll/core/errors.h"
#include "ckpt/small_disk.h"
#include "ckpt_test_util.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

template <class F>
std::string io_error_of(F&& f) {
  try {
    f();
  } catch (const IoError& e) {
    return e.what();
  }
  return "no IoError";
}

TEST(DiskFull, FileWriterSaysDiskFullAndNamesThePath) {
  const std::string e = io_error_of([] {
    FileWriter w("/dev/full");
    const std::vector<char> bytes(1 << 16, 'x');
    w.write(bytes.data(), bytes.size());
    w.sync();
    w.close();
  });
  EXPECT_NE(e.find("/dev/full"), std::string::npos) << e;
  EXPECT_NE(e.find("disk full"), std::string::npos) << e;
  EXPECT_NE(e.find("fix: free space"), std::string::npos) << e;
}

TEST(DiskFull, AtomicTextFileLeavesNoTemporaryBehind) {
  const auto r = testing::on_small_disk(16, [](const std::string& disk) {
    const std::string e = io_error_of([&] { write_text_file_atomic(disk + "/big.txt", std::string(64 << 10, 'x')); });
    std::string left;
    for (const auto& f : fs::directory_iterator(disk)) left += f.path().filename().string() + " ";
    return e + "|left: " + left;
  });
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs here";
  EXPECT_NE(r->find("big.txt"), std::string::npos) << *r;
  EXPECT_NE(r->find("disk full"), std::string::npos) << *r;
  EXPECT_TRUE(r->ends_with("|left: ")) << *r;  // not even the temporary
}

TEST(DiskFull, CheckpointSaveNamesTheFileAndKeepsTheOldCheckpoint) {
  const ModelConfig model = testing::small_model();
  const ParamLayout layout = ParamLayout::build(model);
  Config cfg;
  cfg.model = model;
  const std::vector<float> param = testing::pattern(layout.total(), 1), m = testing::pattern(layout.total(), 2),
                           v = testing::pattern(layout.total(), 3);
  auto save = [&](const std::string& run, int64_t step) {
    return save_checkpoint({.run_dir = run, .step = step}, cfg, layout,
                           {{"param", const_cast<float*>(param.data())},
                            {"adam_m", const_cast<float*>(m.data())},
                            {"adam_v", const_cast<float*>(v.data())}},
                           nlohmann::json::object());
  };
  // A disk with room for one and a half checkpoints: the first fits, the second does not.
  testing::ScratchDir scratch;
  uintmax_t bytes = 0;
  for (const auto& f : fs::recursive_directory_iterator(save(scratch.str(), 1)))
    if (f.is_regular_file()) bytes += (f.file_size() + 4095) / 4096 * 4096;  // tmpfs counts whole pages
  const auto r = testing::on_small_disk(size_t(bytes * 3 / 2 / 1024), [&](const std::string& disk) {
    save(disk, 1);
    const std::string e = io_error_of([&] { save(disk, 2); });
    std::vector<std::string> names;
    for (const auto& f : fs::directory_iterator(disk + "/checkpoints")) names.push_back(f.path().filename().string());
    std::sort(names.begin(), names.end());
    std::string left;
    for (const auto& n : names) left += n + " ";
    return e + "|left: " + left;
  });
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs here";
  EXPECT_NE(r->find("disk full"), std::string::npos) << *r;
  EXPECT_NE(r->find("rank-00000.safetensors"), std::string::npos) << *r;
  EXPECT_NE(r->find("fix: free space"), std::string::npos) << *r;
  const std::string left = r->substr(r->find("|left: "));
  EXPECT_EQ(left, "|left: latest step-00000001 ") << *r;  // nothing half-written, the old one intact
}

TEST(DiskFull, ExportNamesTheFile) {
  const ModelConfig model = testing::small_model();
  const ParamLayout layout = ParamLayout::build(model);
  const std::vector<float> param = testing::pattern(layout.total(), 1);
  const auto r = testing::on_small_disk(16, [&](const std::string& disk) {
    return io_error_of([&] { export_hf(disk + "/hf", model, layout, param.data()); });
  });
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs here";
  EXPECT_NE(r->find("disk full"), std::string::npos) << *r;
  EXPECT_NE(r->find(".safetensors"), std::string::npos) << *r;
}

}  // namespace
}  // namespace atl
