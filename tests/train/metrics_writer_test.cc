// metrics.jsonl and events.jsonl on a full disk: the writer says "disk full" and names the file,
// also when the disk fills in the middle of a line (a short write, after which errno used to be
// stale: "Resource temporarily unavailable"). /dev/full for the first, a tmpfs of the test's own
// for the second (ckpt/small_disk.h).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "atoll/core/errors.h"
#include "atoll/train/metrics.h"
#include "ckpt/small_disk.h"

namespace atl {
namespace {

std::string error_of_rows(const std::string& path, size_t row_bytes, int rows) {
  try {
    JsonlWriter w(path);
    for (int i = 0; i < rows; ++i) w.write({{"step", i}, {"pad", std::string(row_bytes, 'x')}});
  } catch (const IoError& e) {
    return e.what();
  }
  return "no IoError";
}

TEST(JsonlWriterOnAFullDisk, SaysDiskFullAndNamesTheFile) {
  const std::string e = error_of_rows("/dev/full", 10, 1);
  EXPECT_NE(e.find("/dev/full"), std::string::npos) << e;
  EXPECT_NE(e.find("disk full"), std::string::npos) << e;
  EXPECT_NE(e.find("fix: free space"), std::string::npos) << e;
}

TEST(JsonlWriterOnAFullDisk, ALineCutShortByTheDiskIsStillDiskFull) {
  // 5000-byte lines into 16 KiB: the fourth line is written in part, then the disk is full.
  const auto r = testing::on_small_disk(16, [](const std::string& disk) {
    return error_of_rows(disk + "/metrics.jsonl", 5000, 10);
  });
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs here";
  EXPECT_NE(r->find("metrics.jsonl"), std::string::npos) << *r;
  EXPECT_NE(r->find("disk full"), std::string::npos) << *r;
  EXPECT_EQ(r->find("temporarily"), std::string::npos) << *r;
}

TEST(JsonlWriterOnAFullDisk, TruncatingAfterAResumeSaysDiskFull) {
  const auto r = testing::on_small_disk(16, [](const std::string& disk) {
    const std::string path = disk + "/metrics.jsonl";
    {
      JsonlWriter w(path);
      for (int i = 0; i < 2; ++i) w.write({{"step", i}, {"pad", std::string(5000, 'x')}});
    }
    try {
      truncate_jsonl_after_step(path, 1);  // rewrites 10 KB through a temporary: no room for it
    } catch (const IoError& e) {
      return std::string(e.what());
    }
    return std::string("no IoError");
  });
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs here";
  EXPECT_NE(r->find("metrics.jsonl"), std::string::npos) << *r;
  EXPECT_NE(r->find("disk full"), std::string::npos) << *r;
}

// A launched worker's time_s counts from the run's start (ATOLL_RUN_START, the first event's
// wall time), so a restarted worker's rows go on from its island's time instead of from 0.
TEST(RunStart, TheRunsFirstEventIsItsStartAndWorkersCountFromIt) {
  const std::string dir = ::testing::TempDir() + "/run-start-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/events.jsonl") << "{\"event\":\"launch\",\"time\":1000.5}\n{\"event\":\"end\",\"time\":2000}\n";
  EXPECT_EQ(run_start_wall_s(dir), 1000.5);
  const double now = event_row("x")["time"].get<double>();
  std::filesystem::remove(dir + "/events.jsonl");
  EXPECT_NEAR(run_start_wall_s(dir), now, 5.0) << "a new run starts now";
  ::setenv("ATOLL_RUN_START", std::to_string(now - 100.0).c_str(), 1);
  EXPECT_NEAR(seconds_since_run_start(), 100.0, 5.0);
  for (const char* bad : {"", "soon", "1e300", "-5"}) {
    ::setenv("ATOLL_RUN_START", bad, 1);
    EXPECT_EQ(seconds_since_run_start(), 0.0) << bad;
  }
  ::unsetenv("ATOLL_RUN_START");
  EXPECT_EQ(seconds_since_run_start(), 0.0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atl
