// ATOLL_FAULT: the forms it accepts, malformed values refused naming the part and the fix, and
// an armed fault firing at exactly the chosen point (in a forked child: it really dies or stops).
#include "atoll/core/fault_injection.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "atoll/core/errors.h"

namespace atl {
namespace {

using Action = FaultSpec::Action;

TEST(FaultSpec, ParsesTheRingAndTransferForms) {
  const FaultSpec a = parse_fault_spec("kill:island=2:outer_step=3:ring_chunk=5");
  EXPECT_EQ(a.action, Action::kKill);
  EXPECT_EQ(a.island, 2);
  EXPECT_EQ(a.rank, -1);
  EXPECT_EQ(a.outer_step, 3);
  EXPECT_EQ(a.ring_chunk, 5);
  EXPECT_EQ(a.transfer, -1);
  const FaultSpec b = parse_fault_spec("corrupt:island=0:rank=1:transfer=1");
  EXPECT_EQ(b.action, Action::kCorrupt);
  EXPECT_EQ(b.rank, 1);
  EXPECT_EQ(b.transfer, 1);
  EXPECT_EQ(parse_fault_spec("hang:island=1:transfer=2").action, Action::kHang);
  const FaultSpec adm = parse_fault_spec("kill:island=1:admission=2");
  EXPECT_EQ(adm.admission, 2);
  EXPECT_EQ(adm.transfer, -1);
  EXPECT_EQ(parse_fault_spec("").action, Action::kNone);
  const FaultSpec u = parse_fault_spec("corrupt:island=1:outer_step=4:update=replay");
  EXPECT_EQ(u.action, Action::kCorrupt);
  EXPECT_EQ(u.outer_step, 4);
  EXPECT_EQ(u.update, FaultSpec::Update::kReplay);
  EXPECT_EQ(parse_fault_spec("corrupt:island=1:outer_step=4:update=nan").update, FaultSpec::Update::kNan);
  EXPECT_EQ(parse_fault_spec("corrupt:island=1:outer_step=4:update=scale").update, FaultSpec::Update::kScale);
  EXPECT_EQ(parse_fault_spec("corrupt:island=1:outer_step=4:update=flip").update, FaultSpec::Update::kFlip);
}

TEST(FaultSpec, ParsesTheDelayStallAndLossForms) {
  const FaultSpec d = parse_fault_spec("delay:island=2:outer_step=3:seconds=4");
  EXPECT_EQ(d.action, Action::kDelay);
  EXPECT_EQ(d.outer_step, 3);
  EXPECT_EQ(d.seconds, 4.0);
  const FaultSpec s = parse_fault_spec("stall:island=0:rank=1:step=7:seconds=9");
  EXPECT_EQ(s.action, Action::kStall);
  EXPECT_EQ(s.step, 7);
  EXPECT_EQ(s.seconds, 9.0);
  const FaultSpec n = parse_fault_spec("corrupt:island=1:step=5:loss=nan");
  EXPECT_EQ(n.action, Action::kCorrupt);
  EXPECT_EQ(n.step, 5);
  EXPECT_EQ(n.loss, FaultSpec::Loss::kNan);
  EXPECT_EQ(parse_fault_spec("corrupt:island=1:step=5:loss=spike").loss, FaultSpec::Loss::kSpike);
  const FaultSpec c = parse_fault_spec("delay:island=1:rank=0:ckpt=copy:save=2:seconds=3");
  EXPECT_EQ(c.action, Action::kDelay);
  EXPECT_EQ(c.ckpt, "copy");
  EXPECT_EQ(c.save, 2);
  EXPECT_EQ(c.seconds, 3.0);
  EXPECT_EQ(c.outer_step, -1);
  EXPECT_EQ(parse_fault_spec("kill:island=0:ckpt=copy").ckpt, "copy");
  const FaultSpec j = parse_fault_spec("kill:island=2:rank=1:join=start");
  EXPECT_TRUE(j.join);
  EXPECT_EQ(j.rank, 1);
  EXPECT_FALSE(parse_fault_spec("kill:island=2:transfer=1").join);
}

std::string error_of(const std::string& text) {
  try {
    parse_fault_specs(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(FaultSpec, MalformedValuesAreConfigErrorsNamingThePart) {
  const struct {
    const char* text;
    const char* names;
  } cases[] = {{"explode:island=1:transfer=1", "unknown action 'explode'"},
               {"kill:outer_step=1:ring_chunk=1", "no island"},
               {"kill:island=x:transfer=1", "island=x"},
               {"kill:island=1:outer_step=0:ring_chunk=1", "outer_step=0"},
               {"kill:island=1:outer_step=2", "go together"},
               {"kill:island=1", "name one point"},
               {"kill:island=1:transfer=1:outer_step=1:ring_chunk=1", "name one point"},
               {"kill:island=1:transfer=1:admission=1", "name one point"},
               {"kill:island=1:admission=0", "admission=0 is not a whole number >= 1"},
               {"corrupt:island=1:admission=1", "state transfers (transfer=K), ring messages"},
               {"corrupt:island=1:outer_step=1:update=zero", "update=zero is not nan, scale, flip or replay"},
               {"kill:island=1:outer_step=1:update=nan", "goes with corrupt"},
               {"corrupt:island=1:update=nan", "takes outer_step=S alone"},
               {"corrupt:island=1:outer_step=1:ring_chunk=2:update=nan", "takes outer_step=S alone"},
               {"kill:island=1:when=now", "unknown key 'when'"},
               {"kill:island=1:transfer", "not key=value"},
               {"delay:island=1:outer_step=2", "seconds=X (above 0)"},
               {"delay:island=1:step=2:seconds=1", "delay takes outer_step=S:seconds=X alone"},
               {"delay:island=1:ckpt=tensor:seconds=1", "or ckpt=copy[:save=K]:seconds=X"},
               {"delay:island=1:ckpt=copy:outer_step=2:seconds=1", "or ckpt=copy[:save=K]:seconds=X"},
               {"kill:island=1:ckpt=snapshot", "ckpt=snapshot is not a checkpoint point"},
               {"stall:island=1:outer_step=2:seconds=1", "stall takes step=K:seconds=X alone"},
               {"kill:island=1:transfer=1:seconds=2", "seconds=X (above 0)"},
               {"corrupt:island=1:step=2:loss=inf", "loss=inf is not nan or spike"},
               {"kill:island=1:step=2:loss=nan", "goes with corrupt"},
               {"corrupt:island=1:step=2", "goes with corrupt and takes step=K alone"},
               {"kill:island=1:join=later", "join=later is not start"},
               {"corrupt:island=1:join=start", "join=start goes with kill or hang, alone"},
               {"kill:island=1:transfer=1:join=start", "join=start goes with kill or hang, alone"}};
  for (const auto& c : cases) {
    const std::string e = error_of(c.text);
    EXPECT_NE(e.find(std::string("ATOLL_FAULT='") + c.text + "'"), std::string::npos) << c.text << ": " << e;
    EXPECT_NE(e.find(c.names), std::string::npos) << c.text << ": " << e;
    EXPECT_NE(e.find("fix"), std::string::npos) << e;
  }
}

// Runs fn in a forked child; returns its wait status (the child exits 0 when fn returns).
template <class Fn>
int in_child(Fn&& fn) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    fn();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, WUNTRACED);
  if (WIFSTOPPED(status)) {  // a hang: let it go on, then see it finish
    ::kill(pid, SIGKILL);
    int ignored = 0;
    ::waitpid(pid, &ignored, 0);
  }
  return status;
}

// corrupt at a ring message: that message alone, once (the ring flips a byte of it on the wire).
TEST(FaultInjection, CorruptsTheChosenRingMessageOnce) {
  ::setenv("ATOLL_FAULT", "corrupt:island=1:outer_step=2:ring_chunk=3", 1);
  arm_fault_injection(1, 0);
  fault_outer_step(2);
  std::vector<bool> fired;
  for (int i = 0; i < 5; ++i) fired.push_back(fault_ring_message());
  EXPECT_EQ(fired, (std::vector<bool>{false, false, true, false, false}));
  fault_outer_step(2);  // the same step retried: fired already
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(fault_ring_message());
  disarm_fault_injection();
  ::unsetenv("ATOLL_FAULT");
}

TEST(FaultInjection, KillsAtTheChosenRingMessageOfTheChosenOuterStep) {
  ::setenv("ATOLL_FAULT", "kill:island=2:outer_step=3:ring_chunk=4", 1);
  const int status = in_child([] {
    arm_fault_injection(2, 0);
    fault_outer_step(2);
    for (int i = 0; i < 10; ++i) fault_ring_message();  // another outer step: nothing
    fault_outer_step(3);
    for (int i = 0; i < 3; ++i) fault_ring_message();
    ::_exit(7);  // not reached when the 4th message kills, below; reached means too early
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 7) << "fired before the 4th message: " << status;
  const int killed = in_child([] {
    arm_fault_injection(2, 0);
    fault_outer_step(3);
    for (int i = 0; i < 4; ++i) fault_ring_message();
    ::_exit(7);
  });
  EXPECT_TRUE(WIFSIGNALED(killed) && WTERMSIG(killed) == SIGKILL) << killed;
  ::unsetenv("ATOLL_FAULT");
}

TEST(FaultInjection, OnlyTheNamedWorkerIsArmedAndHangStopsIt) {
  ::setenv("ATOLL_FAULT", "hang:island=1:rank=1:transfer=2", 1);
  const int other = in_child([] {
    arm_fault_injection(1, 0);  // another rank: never fires
    for (int i = 0; i < 5; ++i) fault_transfer_tensor();
  });
  EXPECT_TRUE(WIFEXITED(other) && WEXITSTATUS(other) == 0) << other;
  const int stopped = in_child([] {
    arm_fault_injection(1, 1);
    fault_transfer_tensor();
    fault_transfer_tensor();
  });
  EXPECT_TRUE(WIFSTOPPED(stopped) && WSTOPSIG(stopped) == SIGSTOP) << stopped;
  ::unsetenv("ATOLL_FAULT");
}

// join=start is armed in restarts only, and kills each of them at its start; the other faults
// are armed in a first start only.
TEST(FaultInjection, JoinStartKillsEveryRestartAndNoFirstStart) {
  ::setenv("ATOLL_FAULT", "kill:island=2:join=start,hang:island=2:transfer=1", 1);
  const int first = in_child([] {
    arm_fault_injection(2, 0, /*join=*/false);
    fault_join_start();
    ::_exit(7);
  });
  EXPECT_TRUE(WIFEXITED(first) && WEXITSTATUS(first) == 7) << first;
  for (int restart = 0; restart < 2; ++restart) {
    const int status = in_child([] {
      arm_fault_injection(2, 0, /*join=*/true);
      fault_transfer_tensor();  // a first start's fault: not armed in a restart
      fault_join_start();
      ::_exit(7);
    });
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  }
  ::unsetenv("ATOLL_FAULT");
}

TEST(FaultSpec, SeveralSpecsJoinedByCommas) {
  const std::vector<FaultSpec> f = parse_fault_specs("kill:island=2:outer_step=3:ring_chunk=1,corrupt:island=0:transfer=1");
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].action, Action::kKill);
  EXPECT_EQ(f[1].action, Action::kCorrupt);
  EXPECT_TRUE(parse_fault_specs("").empty());
  EXPECT_NE(error_of("kill:island=2:transfer=1,oops").find("unknown action 'oops'"), std::string::npos);
}

TEST(FaultInjection, CorruptMarksExactlyOneTransferTensor) {
  ::setenv("ATOLL_FAULT", "corrupt:island=0:transfer=2,kill:island=1:transfer=1", 1);
  arm_fault_injection(0, 0);  // the kill names island 1: not armed here
  EXPECT_FALSE(fault_transfer_tensor());
  EXPECT_TRUE(fault_transfer_tensor());
  EXPECT_FALSE(fault_transfer_tensor());  // once per process
  disarm_fault_injection();
  ::setenv("ATOLL_FAULT", "corrupt:island=0", 1);
  EXPECT_THROW(arm_fault_injection(5, 0), ConfigError) << "malformed is an error even for another worker";
  ::unsetenv("ATOLL_FAULT");
}

TEST(FaultInjection, ALossIsCorruptedOnceAtTheChosenStep) {
  ::setenv("ATOLL_FAULT", "corrupt:island=0:step=3:loss=spike,corrupt:island=0:step=4:loss=nan", 1);
  arm_fault_injection(0, 0);
  EXPECT_EQ(fault_loss(2, 5.0), 5.0);
  EXPECT_EQ(fault_loss(3, 5.0), 5000.0);
  EXPECT_EQ(fault_loss(3, 5.0), 5.0) << "once per process";
  EXPECT_TRUE(std::isnan(fault_loss(4, 5.0)));
  disarm_fault_injection();
  ::unsetenv("ATOLL_FAULT");
}

TEST(FaultInjection, AnUpdateIsCorruptedOnceAtTheChosenOuterStep) {
  ::setenv("ATOLL_FAULT", "corrupt:island=0:outer_step=3:update=flip,corrupt:island=1:outer_step=2:update=nan", 1);
  arm_fault_injection(0, 0);
  EXPECT_TRUE(fault_update_armed());
  fault_outer_step(2);
  EXPECT_EQ(fault_update(), FaultSpec::Update::kNone) << "outer step 2's names island 1";
  fault_outer_step(3);
  fault_ring_message();  // not a ring fault: nothing fires here
  EXPECT_EQ(fault_update(), FaultSpec::Update::kFlip);
  EXPECT_EQ(fault_update(), FaultSpec::Update::kNone) << "once per process";
  EXPECT_FALSE(fault_update_armed());
  disarm_fault_injection();
  ::unsetenv("ATOLL_FAULT");
}

}  // namespace
}  // namespace atl
