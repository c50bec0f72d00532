// Every path a user gives, through every flag and config key that takes one, is checked for what
// it is before it is opened (core/user_path.h): a named pipe with no writer, a device
// (/dev/zero never ends) or a socket is refused at once with one line naming the flag or key, the
// path and what it is, and nothing is written. A pipe that were opened would block: each run
// has a short timeout on the test's side, and "timed out" fails the test.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

constexpr double kQuick = 30;  // seconds: a refusal takes well under one; a blocked open never ends

class UserPaths : public CliTest {
 protected:
  // A named pipe, a socket and a character device, each with the words that say what it is.
  struct Special {
    std::string path, kind;
  };
  std::vector<Special> specials() {
    const std::string fifo = dir("pipe"), sock = dir("sock");
    if (!fs::exists(fifo)) {
      EXPECT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    }
    if (sock_fd_ < 0) {
      sock_fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
      EXPECT_EQ(::bind(sock_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << sock;
    }
    return {{fifo, "a named pipe"}, {sock, "a socket"}, {"/dev/zero", "a character device"}};
  }
  void TearDown() override {
    if (sock_fd_ >= 0) ::close(sock_fd_);
  }

  // Runs `args` with "@" replaced by each special file; each must be refused quickly, naming
  // `name` (the flag or key with "@" for the path) and the path's kind, with nothing written
  // under dir().
  void refuses_specials(const std::vector<std::string>& args, const std::string& name) {
    for (const Special& s : specials()) {
      std::vector<std::string> a = args;
      for (std::string& x : a)
        if (const size_t at = x.find('@'); at != std::string::npos) x.replace(at, 1, s.path);
      std::string named = name;
      named.replace(named.find('@'), 1, s.path);
      const auto before = snapshot(dir());
      const RunResult r = run_atoll(a, kQuick);
      EXPECT_TRUE(fails_clearly(r, {named, s.kind})) << s.path;
      EXPECT_TRUE(unchanged(before, snapshot(dir()))) << r.command;
    }
  }

 private:
  int sock_fd_ = -1;
};

TEST_F(UserPaths, PrepareFlags) {
  refuses_specials({"data", "prepare", "--input", "@", "--out", dir("out"), "--vocab-size", "384"}, "--input @");
  refuses_specials({"data", "prepare", "--input", world().corpus(), "--out", "@"}, "--out @");
  refuses_specials({"data", "prepare", "--input", world().corpus(), "--out", dir("out"), "--tokenizer", "@"},
                   "--tokenizer @");
}

TEST_F(UserPaths, TrainFlagsAndDataKeys) {
  const std::string micro = world().config();
  refuses_specials({"train", "--config", "@", "--run-dir", dir("run")}, "--config @");
  refuses_specials({"train", "--config", micro, "--run-dir", "@"}, "--run-dir @");
  refuses_specials({"train", "--config", micro, "--run-dir", dir("run"), "--init-from", "@"}, "--init-from @");
  refuses_specials({"train", "--config", micro, "--run-dir", dir("run"), "--set", "data.input=[\"@\"]", "--set",
                    "data.dir=\"" + dir("d") + "\""},
                   "data.input[0] = \"@\"");
  refuses_specials({"train", "--config", micro, "--run-dir", dir("run"), "--set", "data.dir=\"@\""}, "data.dir = \"@\"");
  refuses_specials({"train", "--config", micro, "--run-dir", dir("run"), "--set", "data.input=[]", "--set",
                    "data.dir=\"\"", "--set", "data.mix=[{dir = \"@\", weight = 1}]"},
                   "data.mix[0].dir = \"@\"");
}

TEST_F(UserPaths, CheckpointReaders) {
  const std::string run = base_run();
  refuses_specials({"eval", "--checkpoint", "@"}, "--checkpoint @");
  refuses_specials({"eval", "--checkpoint", run, "--data", "@"}, "--data @");
  refuses_specials({"generate", "--checkpoint", run, "--prompt", "a", "--tokenizer", "@"}, "--tokenizer @");
  refuses_specials({"export", "--checkpoint", "@", "--format", "hf", "--out", dir("e")}, "--checkpoint @");
  refuses_specials({"export", "--checkpoint", run, "--format", "hf", "--out", "@"}, "--out @");
}

TEST_F(UserPaths, WorkerFiles) {
  // Refused before the store (a port nothing listens on) is ever asked.
  const std::vector<std::string> worker = {"worker", "--store", "redis://127.0.0.1:1", "--island", "0", "--rank", "0",
                                           "--islands", "1", "--config", world().config()};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = worker;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  refuses_specials(with({"--token-file", "@"}), "--token-file @");
  refuses_specials(with({"--run-dir", "@"}), "--run-dir @");
}

// An input named twice in other spellings (a trailing "/", "./", a symlink) is refused naming
// both; so is a dataset of a mixture, within a mixture or spelled two ways across phases.
TEST_F(UserPaths, OneFileOrFolderInTwoSpellingsIsRefusedNamingBoth) {
  fs::create_directories(dir("texts"));
  fs::copy_file(world().corpus(), dir("texts/c.txt"));
  fs::create_directory_symlink(dir("texts"), dir("alias"));
  const auto before = snapshot(dir());
  RunResult r = run_atoll({"data", "prepare", "--input", dir("texts"), "--input", dir("alias"), "--out", dir("out")}, kQuick);
  EXPECT_TRUE(fails_clearly(r, {"--input " + dir("texts"), "--input " + dir("alias"), "two spellings"}));
  r = run_atoll({"data", "prepare", "--input", dir("texts") + "/./c.txt", "--input", dir("texts/c.txt"), "--out", dir("out")},
                kQuick);
  EXPECT_TRUE(fails_clearly(r, {dir("texts") + "/./c.txt", dir("texts/c.txt"), "same file"}));
  r = run_atoll({"train", "--config", world().config(), "--run-dir", dir("run0"), "--set",
                 "data.input=[\"" + world().corpus() + "\", \"" + world().root() + "/./corpus.txt\"]"},
                kQuick);
  EXPECT_TRUE(fails_clearly(r, {"data.input[0]", "data.input[1]", "two spellings"}));
  EXPECT_TRUE(unchanged(before, snapshot(dir())));

  world().train(world().path("prepared-once"), {"--set", "train.steps=0"});  // prepares world().data_dir()
  const std::string data = world().data_dir();
  const std::vector<std::string> mix = {"train", "--config", world().config(), "--run-dir", dir("run1"), "--set",
                                        "data.input=[]", "--set", "data.dir=\"\""};
  auto with = [&](const std::string& item) {
    std::vector<std::string> a = mix;
    a.insert(a.end(), {"--set", item});
    return a;
  };
  r = run_atoll(with("data.mix=[{dir = \"" + data + "\", weight = 1}, {dir = \"" + data + "/\", weight = 1}]"), kQuick);
  EXPECT_TRUE(fails_clearly(r, {"data.mix[0].dir", "data.mix[1].dir = \"" + data + "/\"", "same folder"}));
  r = run_atoll(with("data.phases=[{at_tokens = 0, mix = [{dir = \"" + data + "\"}]}, {at_tokens = 100, mix = [{dir = \"" +
                     world().root() + "/./data\"}]}]"),
                kQuick);
  EXPECT_TRUE(fails_clearly(r, {"data.phases[0].mix[0].dir", "data.phases[1].mix[0].dir", "two spellings"}));
  EXPECT_TRUE(unchanged(before, snapshot(dir())));
}

// The folder walk of an input: a symlink loop is walked once, a dangling symlink and a pipe
// inside are skipped with a warning naming them (never opened), and an --out inside the input
// folder is not read back as input on the next run (the rerun that resumes or reuses it).
TEST_F(UserPaths, InputFolderWalkSkipsLoopsSpecialsAndItsOwnOutput) {
  fs::create_directories(dir("in/sub"));
  fs::copy_file(world().corpus(), dir("in/c.txt"));
  fs::create_directory_symlink("..", dir("in/sub/up"));
  fs::create_symlink("nothing-here", dir("in/dangling.txt"));
  ASSERT_EQ(::mkfifo(dir("in/pipe.txt").c_str(), 0600), 0);
  const std::vector<std::string> args = {"data", "prepare", "--input", dir("in"), "--out", dir("in/out"), "--vocab-size", "384"};
  RunResult r = run_atoll(args, 120);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.err.find(dir("in/sub/up") + ": skipped"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(dir("in/dangling.txt") + ": skipped, it is a dangling symbolic link"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(dir("in/pipe.txt") + ": skipped, it is a named pipe"), std::string::npos) << r.err;
  const auto meta = nlohmann::json::parse(read_file(dir("in/out/meta.json")));
  r = run_atoll(args, 120);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.out.find("reused"), std::string::npos) << r.describe();
  EXPECT_EQ(nlohmann::json::parse(read_file(dir("in/out/meta.json"))), meta);
}

}  // namespace
}  // namespace atl::testing
