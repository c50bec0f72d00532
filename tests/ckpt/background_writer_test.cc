// The background writer's fence (ckpt/background_writer.h): it returns once the job in flight
// has released the caller's buffers, while the job itself goes on; once per submit. Jobs wait on
// promises the test fulfils, so the order of events is fixed without timing.
#include "atoll/ckpt/background_writer.h"

#include <gtest/gtest.h>

#include <future>
#include <stdexcept>

namespace atl::testing {
namespace {

TEST(BackgroundWriter, FenceReturnsAtReleaseWhileTheJobGoesOn) {
  BackgroundWriter w;
  EXPECT_FALSE(w.fence().has_value()) << "nothing submitted: nothing to wait for";
  std::promise<void> go_on;
  std::shared_future<void> may_finish = go_on.get_future().share();
  bool finished = false;
  w.submit([&] {
    w.release();
    may_finish.wait();
    finished = true;
  });
  // Would hang (ctest's timeout) if the fence waited for the job's end, which needs go_on.
  const std::optional<double> waited = w.fence();
  ASSERT_TRUE(waited.has_value());
  EXPECT_GE(*waited, 0.0);
  EXPECT_FALSE(w.fence().has_value()) << "a second fence for the same job";
  go_on.set_value();
  w.wait();
  EXPECT_TRUE(finished);
}

TEST(BackgroundWriter, FenceReturnsWhenTheJobFailsBeforeReleasingAndWaitRethrows) {
  BackgroundWriter w;
  w.submit([] { throw std::runtime_error("copy failed"); });
  EXPECT_TRUE(w.fence().has_value());
  EXPECT_THROW(w.wait(), std::runtime_error);
  w.submit([] {});  // a job that never calls release(): its end releases
  EXPECT_TRUE(w.fence().has_value());
  w.wait();
}

}  // namespace
}  // namespace atl::testing
