// Learning-rate and batch-size schedules on values worked out by hand.
#include "atoll/optim/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "atoll/core/check.h"

namespace atl {
namespace {

// Closed forms evaluated in double on both sides: only rounding differs.
constexpr double kTol = 1e-12;

// lr 1, lr_min 0.1, 10 warmup steps, 110 steps: 100 after warmup.
OptimConfig sched(const char* name) {
  OptimConfig c;
  c.lr = 1.0, c.min_lr_ratio = 0.1, c.warmup_steps = 10, c.schedule = name, c.decay_frac = 0.2;
  return c;
}

TEST(LrSchedule, Warmup) {
  for (const char* name : {"cosine", "wsd", "constant"}) {
    const OptimConfig c = sched(name);
    EXPECT_NEAR(lr_at(c, 0, 110), 0.1, kTol);  // (0+1)/10
    EXPECT_NEAR(lr_at(c, 4, 110), 0.5, kTol);
    EXPECT_NEAR(lr_at(c, 9, 110), 1.0, kTol);  // the last warmup step reaches lr
  }
}

TEST(LrSchedule, Cosine) {
  const OptimConfig c = sched("cosine");
  // p = (step - 10 + 1)/100; lr = 0.1 + 0.45 (1 + cos(pi p)).
  EXPECT_NEAR(lr_at(c, 10, 110), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.01)), kTol);
  EXPECT_NEAR(lr_at(c, 59, 110), 0.55, kTol);                               // midpoint, p = 1/2
  EXPECT_NEAR(lr_at(c, 84, 110), 0.1 + 0.45 * (1 - std::sqrt(0.5)), kTol);  // p = 3/4
  EXPECT_NEAR(lr_at(c, 109, 110), 0.1, kTol);                               // the last step takes lr_min
  EXPECT_NEAR(lr_at(c, 500, 110), 0.1, kTol);                               // past the end
}

TEST(LrSchedule, Wsd) {
  const OptimConfig c = sched("wsd");
  // D = 0.2 * 110 = 22 decay steps: 88..109; step 88 + i takes 1 - 0.9 (i+1)/22.
  for (int s : {10, 50, 87}) EXPECT_NEAR(lr_at(c, s, 110), 1.0, kTol) << s;
  EXPECT_NEAR(lr_at(c, 88, 110), 1.0 - 0.9 / 22, kTol);
  EXPECT_NEAR(lr_at(c, 98, 110), 0.55, kTol);  // i = 10: halfway
  EXPECT_NEAR(lr_at(c, 109, 110), 0.1, kTol);
  OptimConfig no_decay = c;
  no_decay.decay_frac = 0.0;
  EXPECT_NEAR(lr_at(no_decay, 109, 110), 1.0, kTol);
  EXPECT_NEAR(lr_at(no_decay, 200, 110), 1.0, kTol);
}

TEST(LrSchedule, ConstantAndErrors) {
  EXPECT_NEAR(lr_at(sched("constant"), 109, 110), 1.0, kTol);
  OptimConfig no_warmup = sched("cosine");
  no_warmup.warmup_steps = 0;
  EXPECT_NEAR(lr_at(no_warmup, 0, 100), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.01)), kTol);
  EXPECT_THROW(lr_at(sched("linear"), 50, 110), CheckError);
  EXPECT_THROW(lr_at(sched("linear"), 0, 110), CheckError);  // in warmup too
}

TEST(BatchRamp, GrowsAndRoundsToMicroBatches) {
  TrainConfig t;
  t.batch_size = 64, t.micro_batch_size = 8, t.batch_ramp_start = 8, t.batch_ramp_tokens = 56000;
  // b = 8 + 56 tokens / 56000 = 8 + tokens / 1000, rounded down to a multiple of 8.
  EXPECT_EQ(batch_at(t, 0, 256), 8);
  EXPECT_EQ(batch_at(t, 7999, 256), 8);  // 15.999 -> 15 -> 8
  EXPECT_EQ(batch_at(t, 8000, 256), 16);
  EXPECT_EQ(batch_at(t, 28000, 256), 32);  // 36 -> 32
  EXPECT_EQ(batch_at(t, 55999, 256), 56);  // 63 -> 56
  EXPECT_EQ(batch_at(t, 56000, 256), 64);
  EXPECT_EQ(batch_at(t, 1 << 30, 256), 64);
}

TEST(BatchRamp, AtLeastOneMicroBatchAndOffSwitches) {
  TrainConfig t;
  t.batch_size = 12, t.micro_batch_size = 3, t.batch_ramp_start = 2, t.batch_ramp_tokens = 1000;
  EXPECT_EQ(batch_at(t, 0, 16), 3);    // 2 rounds down to 0: one micro-batch instead
  EXPECT_EQ(batch_at(t, 500, 16), 6);  // 2 + 10 * 0.5 = 7 -> 6
  t.micro_batch_size = 0;              // micro = batch_size: nothing smaller to ramp through
  EXPECT_EQ(batch_at(t, 500, 16), 12);
  TrainConfig off;
  off.batch_size = 12;
  EXPECT_EQ(batch_at(off, 0, 16), 12);
  off.batch_ramp_start = 4;  // tokens still 0: no ramp
  EXPECT_EQ(batch_at(off, 0, 16), 12);
}

}  // namespace
}  // namespace atl
