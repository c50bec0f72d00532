// core/user_path.h: what a path names is found without opening it (a FIFO with no writer would
// block an open forever: the tests arm an alarm as a safety net), and each check refuses the
// wrong kind with one line naming the key, the path, what it is and a fix.
#include "atoll/core/user_path.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>

#include "data/temp_dir.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::write_file;

// Kills the test (SIGALRM) if a check blocks: it must never open a pipe.
struct Watchdog {
  Watchdog() { ::alarm(20); }
  ~Watchdog() { ::alarm(0); }
};

// A folder with one of each kind of thing a user may name.
struct Zoo {
  TempDir dir;
  std::string file = dir / "a.txt", folder = dir / "sub", fifo = dir / "pipe", socket = dir / "sock",
              dangling = dir / "dangling", loop = dir / "loop", missing = dir / "nope";
  int sock_fd = -1;
  Zoo() {
    write_file(file, "text\n");
    fs::create_directories(folder);
    EXPECT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    sock_fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket.c_str());
    EXPECT_EQ(::bind(sock_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << socket;
    fs::create_symlink(dir / "gone", dangling);
    fs::create_symlink(loop, loop);
  }
  ~Zoo() { ::close(sock_fd); }
};

// The PathError message of `f` ("" if it did not throw).
template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const PathError& e) {
    return e.what();
  }
  return "";
}

TEST(UserPath, KindsAreFoundWithoutOpening) {
  Watchdog guard;
  Zoo z;
  EXPECT_EQ(path_kind(z.file), PathKind::kFile);
  EXPECT_EQ(path_kind(z.folder), PathKind::kFolder);
  EXPECT_EQ(path_kind(z.fifo), PathKind::kPipe);
  EXPECT_EQ(path_kind(z.socket), PathKind::kSocket);
  EXPECT_EQ(path_kind("/dev/zero"), PathKind::kCharDevice);
  EXPECT_EQ(path_kind(z.dangling), PathKind::kMissing);
  EXPECT_EQ(path_kind(z.loop), PathKind::kLoop);
  EXPECT_EQ(path_kind(z.missing), PathKind::kMissing);
  EXPECT_EQ(path_kind(z.file + "/x"), PathKind::kNotFolderOnTheWay);
}

TEST(UserPath, EachCheckRefusesTheWrongKindNamingKeyPathAndFix) {
  Watchdog guard;
  Zoo z;
  struct Case {
    std::function<void()> check;
    std::string path, says;
  };
  const std::vector<Case> cases = {
      {[&] { check_input_file(z.fifo, "--config"); }, z.fifo, "is a named pipe"},
      {[&] { check_input_file("/dev/zero", "--config"); }, "/dev/zero", "is a character device"},
      {[&] { check_input_file(z.socket, "--config"); }, z.socket, "is a socket"},
      {[&] { check_input_file(z.folder, "--config"); }, z.folder, "is a folder, not a file"},
      {[&] { check_input_file(z.missing, "--config"); }, z.missing, "does not exist"},
      {[&] { check_input_file(z.dangling, "--config"); }, z.dangling, "does not exist"},
      {[&] { check_input_file(z.loop, "--config"); }, z.loop, "loops"},
      {[&] { check_input_dir(z.file, "--config"); }, z.file, "is a file, not a folder"},
      {[&] { check_input_dir(z.fifo, "--config"); }, z.fifo, "is a named pipe"},
      {[&] { check_input_file_or_dir(z.fifo, "--config"); }, z.fifo, "is a named pipe"},
      {[&] { check_input_file_or_dir("/dev/zero", "--config"); }, "/dev/zero", "is a character device"},
      {[&] { check_output_dir(z.file, "--config"); }, z.file, "is a file, not a folder"},
      {[&] { check_output_dir(z.fifo, "--config"); }, z.fifo, "is a named pipe"},
      {[&] { check_output_dir("/dev/null", "--config"); }, "/dev/null", "is a character device"},
      {[&] { check_output_dir(z.file + "/run", "--config"); }, z.file + "/run", "a file where a folder"},
  };
  for (const Case& c : cases) {
    const std::string msg = refusal(c.check);
    EXPECT_NE(msg.find("--config " + c.path + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
    EXPECT_NE(msg.find("; fix: "), std::string::npos) << msg;
  }
  // A config key is written as the key and its quoted value.
  EXPECT_NE(refusal([&] { check_input_dir(z.fifo, "data.mix[1].dir"); }).find("data.mix[1].dir = \"" + z.fifo + "\""),
            std::string::npos);
  // What each check takes.
  EXPECT_EQ(refusal([&] { check_input_file(z.file, "--config"); }), "");
  EXPECT_EQ(refusal([&] { check_input_dir(z.folder, "--checkpoint"); }), "");
  EXPECT_EQ(refusal([&] { check_input_file_or_dir(z.folder, "--input"); }), "");
  EXPECT_EQ(refusal([&] { check_input_file_or_dir(z.file, "--input"); }), "");
  EXPECT_EQ(refusal([&] { check_output_dir(z.folder, "--out"); }), "");
  EXPECT_EQ(refusal([&] { check_output_dir(z.missing + "/deeper", "--out"); }), "");
}

TEST(UserPath, SpellingsOfOnePathAreOneIdentity) {
  TempDir dir;
  fs::create_directories(dir / "data/a");
  fs::create_directory_symlink(dir / "data/a", dir / "link");
  const std::string id = path_identity(dir / "data/a");
  EXPECT_EQ(path_identity(dir / "data/./a/"), id);
  EXPECT_EQ(path_identity(dir / "link"), id);
  EXPECT_NE(path_identity(dir / "data"), id);
  EXPECT_EQ(path_identity(dir / "new/b"), path_identity(dir / "new/./b/"));  // not there yet: the spelling

  const std::string msg = refusal([&] {
    check_distinct_paths({{"data.input[0]", dir / "data/a"}, {"data.input[1]", dir / "other"}, {"data.input[2]", dir / "link"}},
                         "list each input once");
  });
  EXPECT_NE(msg.find("data.input[0] = \"" + (dir / "data/a") + "\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("data.input[2] = \"" + (dir / "link") + "\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("two spellings"), std::string::npos) << msg;
  EXPECT_EQ(refusal([&] { check_distinct_paths({{"--input", dir / "data"}, {"--input", dir / "data/a"}}, "x"); }), "");
}

TEST(UserPath, FilesystemErrorsBecomeOneLineWithThePathAndAFix) {
  const std::filesystem::filesystem_error e("cannot make canonical path", fs::path("/dev/fd/63"),
                                            std::make_error_code(std::errc::no_such_file_or_directory));
  const std::string line = filesystem_error_line(e);
  EXPECT_EQ(line.find("filesystem error"), std::string::npos) << line;
  EXPECT_EQ(line.rfind("/dev/fd/63: cannot make canonical path (No such file or directory); fix: ", 0), 0u) << line;
  const std::filesystem::filesystem_error loop("status", fs::path("in/sub/up"),
                                               std::make_error_code(std::errc::too_many_symbolic_link_levels));
  EXPECT_NE(filesystem_error_line(loop).find("remove the link"), std::string::npos);
}

}  // namespace
}  // namespace atl
