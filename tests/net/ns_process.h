// Processes in the emulated hosts of tests/net/emulated_hosts.sh (network namespaces): the
// script and its forwarder, and a process started in one namespace with its output in a log
// file, killed by its pid if it still runs at the end. Root only (ip netns).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_util.h"

namespace atl::testing {

inline std::string script() {
  const char* src = std::getenv("ATOLL_SOURCE_DIR");
  return std::string(src && *src ? src : ".") + "/tests/net/emulated_hosts.sh";
}
inline std::string netem() {
  const char* n = std::getenv("ATOLL_NETEM");
  return n && *n ? n : "build/tests/atoll_netem";
}

// A process started in namespace `ns` (with the children's environment, cli_util.h child_env),
// its output in `log`; killed (by its pid) if still running at the end.
class NsProcess {
 public:
  NsProcess(const std::string& ns, const std::vector<std::string>& argv, const std::string& log) {
    std::vector<std::string> all = {"/usr/bin/env"};
    for (const std::string& kv : child_env())  // a bare NAME: removed (env's options come first)
      if (kv.find('=') == std::string::npos) all.insert(all.begin() + 1, {"-u", kv});
    for (const std::string& kv : child_env())  // the micro world's cache folder, ...
      if (kv.find('=') != std::string::npos) all.push_back(kv);
    for (const std::string& a : {std::string("ip"), std::string("netns"), std::string("exec"), ns}) all.push_back(a);
    all.insert(all.end(), argv.begin(), argv.end());
    std::vector<char*> args;
    for (std::string& a : all) args.push_back(a.data());
    args.push_back(nullptr);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open " + log);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(fd);
  }
  ~NsProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  NsProcess(const NsProcess&) = delete;
  NsProcess& operator=(const NsProcess&) = delete;

  // Its exit code once it ended within `timeout_s` (-1: killed by a signal; -2: still running).
  int wait(double timeout_s) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (pid_ > 0) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        break;
      }
      if (std::chrono::steady_clock::now() >= until) return -2;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return code_;
  }
  bool running() { return wait(0) == -2; }

 private:
  pid_t pid_ = -1;
  int code_ = -2;
};

// A test over emulated hosts: skipped without root, ip or redis-server; its hosts are named
// `prefix` + this process's id; every process it started is killed, then the hosts removed.
class EmulatedHostsTest : public CliTest {
 protected:
  explicit EmulatedHostsTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    if (::getuid() != 0) GTEST_SKIP() << "needs root for network namespaces (ip netns)";
    if (std::system("command -v ip >/dev/null 2>&1 && command -v redis-server >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "needs iproute2's ip and redis-server";
    CliTest::SetUp();
    name_ = prefix_ + std::to_string(::getpid() % 100000);
  }
  void TearDown() override {
    procs_.clear();  // each killed by its pid, then the namespaces go (and anything left in them)
    if (!name_.empty())
      std::system(("NETEM=" + netem() + " " + script() + " down " + name_ + " >/dev/null 2>&1").c_str());
  }
  std::string host(int i) const { return name_ + "-h" + std::to_string(i); }
  // `argv` on host h, its output in this test's folder as `log`.
  NsProcess& start(int h, const std::vector<std::string>& argv, const std::string& log) {
    procs_.push_back(std::make_unique<NsProcess>(host(h), argv, dir(log)));
    return *procs_.back();
  }

  std::string name_;
  std::vector<std::unique_ptr<NsProcess>> procs_;

 private:
  std::string prefix_;
};

}  // namespace atl::testing
