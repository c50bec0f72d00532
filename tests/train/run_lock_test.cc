// The run directory's lock (train/run_lock.h) in one process: flock locks belong to an open file
// description, so a second RunLock on the same folder is refused as another process would be.
// A start that fails before commit() leaves the folder as it was.
#include "atoll/train/run_lock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "atoll/core/errors.h"
#include "data/temp_dir.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(RunLock, ASecondHolderIsRefusedNamingTheFirst) {
  testing::TempDir tmp;
  const std::string run = tmp / "run";
  {
    RunLock first(run);
    first.commit();
    EXPECT_NE(read_text(run + "/.lock").find("\"pid\":" + std::to_string(::getpid())), std::string::npos);
    try {
      RunLock second(run);
      FAIL() << "a second lock was granted";
    } catch (const RunDirConflict& e) {
      EXPECT_NE(std::string(e.what()).find("pid " + std::to_string(::getpid())), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(run + "/.lock")) << "the lock file outlived its holder";
  EXPECT_TRUE(fs::is_directory(run)) << "a committed run's folder stays";
  RunLock again(run);  // free once let go
  EXPECT_EQ(again.stale_holder(), "");
}

TEST(RunLock, AnUncommittedStartLeavesTheFolderAsItWas) {
  testing::TempDir tmp;
  { RunLock lock(tmp / "runs/a/b"); }
  EXPECT_FALSE(fs::exists(tmp / "runs")) << "the folders the lock created stay after a failed start";

  // A lock file left by a process that ended: taken over, and put back when the start fails.
  fs::create_directories(tmp / "run");
  const std::string left = "{\"pid\": 99999999, \"host\": \"elsewhere\"}\n";
  std::ofstream(tmp / "run/.lock") << left;
  {
    RunLock lock(tmp / "run");
    EXPECT_EQ(lock.stale_holder(), "pid 99999999 on host elsewhere");
  }
  EXPECT_EQ(read_text(tmp / "run/.lock"), left);
}

}  // namespace
}  // namespace atl
