// The one process spawner: argv on PATH, environment added, descriptors mapped, stdin empty,
// own process group, exit status, a failed exec as an exception, SIGTERM then SIGKILL, and a
// copy in a forked child that leaves the process alone.
#include "atoll/supervise/process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>

namespace atl {
namespace {

using std::chrono::milliseconds;

// A pipe whose write end becomes the child's stdout; the read end stays here.
struct Pipe {
  int fd[2] = {-1, -1};
  Pipe() { EXPECT_EQ(::pipe2(fd, O_CLOEXEC), 0); }
  ~Pipe() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
  void close_write() { ::close(fd[1]), fd[1] = -1; }
  // Reads up to and including the first '\n' (or to EOF).
  std::string line() {
    std::string s;
    char c;
    while (::read(fd[0], &c, 1) == 1 && (s += c, c != '\n')) {
    }
    return s;
  }
};

Process spawn_sh(const std::string& script, Pipe& out, std::vector<std::string> env = {}) {
  Process p = Process::spawn({.argv = {"sh", "-c", script}, .env = std::move(env), .fds = {{out.fd[1], 1}}});
  out.close_write();
  return p;
}

TEST(Process, RunsWithAddedEnvironmentAndReportsItsExitCode) {
  Pipe out;
  Process p = spawn_sh("cat; echo \"$ATOLL_PROCESS_TEST\"; exit 3", out, {"ATOLL_PROCESS_TEST=hello"});
  EXPECT_EQ(out.line(), "hello\n");  // `cat` ended at once: stdin is /dev/null
  const ExitStatus s = p.wait();
  EXPECT_TRUE(s.exited);
  EXPECT_EQ(s.exit_code, 3);
  EXPECT_EQ(s.describe(), "exit 3");
  EXPECT_FALSE(p.running());
}

TEST(Process, RunsInItsOwnProcessGroup) {
  Pipe out;
  Process p = spawn_sh("echo ready; exec sleep 30", out);
  EXPECT_EQ(out.line(), "ready\n");
  EXPECT_EQ(::getpgid(p.pid()), p.pid());
  EXPECT_NE(::getpgid(p.pid()), ::getpgrp());
  const ExitStatus s = p.terminate(milliseconds(5000));
  EXPECT_EQ(s.signal, SIGTERM);
  EXPECT_EQ(s.describe(), "signal 15");
}

TEST(Process, MissingBinaryIsExecFailed) {
  try {
    Process::spawn({.argv = {"atoll-no-such-program"}});
    FAIL() << "spawned a program that does not exist";
  } catch (const ExecFailed& e) {
    EXPECT_EQ(e.error, ENOENT);
    EXPECT_NE(std::string(e.what()).find("cannot run 'atoll-no-such-program'"), std::string::npos) << e.what();
  }
}

TEST(Process, TerminateKillsAChildThatIgnoresSigterm) {
  Pipe out;
  Process p = spawn_sh("trap '' TERM; echo ready; while :; do :; done", out);
  EXPECT_EQ(out.line(), "ready\n");  // the trap is set
  const ExitStatus s = p.terminate(milliseconds(100));
  EXPECT_EQ(s.signal, SIGKILL);
  EXPECT_EQ(p.terminate(milliseconds(100)).signal, SIGKILL);  // idempotent
}

TEST(Process, ACopyInAForkedChildLeavesTheProcessAlone) {
  Pipe out;
  Process p = spawn_sh("echo ready; exec sleep 30", out);
  EXPECT_EQ(out.line(), "ready\n");
  const pid_t fork_pid = ::fork();
  ASSERT_GE(fork_pid, 0);
  if (fork_pid == 0) {  // not the owner: every call is a no-op, the destructor too
    p.signal(SIGKILL);
    p.terminate(milliseconds(0));
    ::_exit(p.poll() ? 1 : 0);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(fork_pid, &st, 0), fork_pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  EXPECT_FALSE(p.poll().has_value());  // still running
  EXPECT_EQ(p.terminate(milliseconds(5000)).signal, SIGTERM);
}

}  // namespace
}  // namespace atl
