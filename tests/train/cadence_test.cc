// The cadence of a run (train/cadence.h) with fake hooks and no engine: which step validates,
// saves a checkpoint, writes its row and ends the run; what a hook that moves the step counter
// ahead does (islands on a time budget), a delayed checkpoint, a stop request, log_every and
// stop_after. Then every small case against a second statement of the rules: the driver's loop
// as it stood before the cadence was split out of it (oracle 1 of STYLE.md: exact results).
#include "atoll/train/cadence.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace atl {
namespace {

// What the fake hooks do in one turn of the driver's loop (a step, or a skipped batch).
struct Turn {
  int64_t jump = 0;            // after_inner_step moves the counter this far ahead (a time budget's commit)
  bool agreed = true;          // steps_agreed() from after_inner_step on (it holds until the next turn's)
  bool can_checkpoint = true;  // can_checkpoint() at the end of the step
  bool stop = false;           // stop_requested() at the end of the step
  bool skip = false;           // keep_batch() false: the batch is skipped, the step does not count
};
using Script = std::function<Turn(int64_t step)>;  // the turn that starts from `step`

// What a run did, step by step.
struct Trace {
  std::vector<int64_t> evals, saves, rows;
  int64_t end = 0;                             // the step the run returned at
  bool stopped = false;                        // a stop request ended it
  bool final_save = false;                     // its end saved a checkpoint (it wrote none)
  std::vector<int64_t> stop_asked, can_asked;  // the steps whose end asked stop_requested, can_checkpoint
  bool operator==(const Trace&) const = default;
};

std::string str(const std::vector<int64_t>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(v[i]);
  }
  return s + "}";
}
std::ostream& operator<<(std::ostream& os, const Trace& t) {
  return os << "evals " << str(t.evals) << " saves " << str(t.saves) << " rows " << str(t.rows) << " end " << t.end
            << (t.stopped ? " stopped" : "") << (t.final_save ? " final_save" : "") << " stop_asked "
            << str(t.stop_asked) << " can_asked " << str(t.can_asked);
}

// The driver's loop (driver.cc run_steps) with fake hooks: the cadence's calls in its order, the
// step itself reduced to ++step. A row is notable when it validated or saved (theta_hash and the
// fence's wait are the hooks' and the save's, which the fakes do not make).
Trace run(const CadenceOptions& o, int64_t step, const Script& script) {
  Trace t;
  Cadence cadence(o, step);
  bool agreed = true;
  Turn turn;
  const CadenceQuestions ask{.stop_requested = [&] { return t.stop_asked.push_back(step), turn.stop; },
                             .steps_agreed = [&] { return agreed; },
                             .can_checkpoint = [&] { return t.can_asked.push_back(step), turn.can_checkpoint; }};
  for (int turns = 0; cadence.more(step) && turns < 1000; ++turns) {
    turn = script(step);
    cadence.start_step(step, agreed);
    if (turn.skip) continue;
    step += 1 + turn.jump;
    agreed = turn.agreed;
    const bool eval = cadence.evaluates(step);
    if (eval) t.evals.push_back(step);
    const StepEnd end = cadence.end_step(step, ask);
    if (end.checkpoint) t.saves.push_back(step);
    if (cadence.row_due(step, eval || end.checkpoint)) t.rows.push_back(step);
    if (end.stop) {
      t.stopped = end.stopped;
      break;
    }
  }
  t.end = step;
  t.final_save = cadence.final_save();
  return t;
}

const Script kPlain = [](int64_t) { return Turn{}; };

CadenceOptions opts(int64_t steps, int64_t eval_every, int64_t checkpoint_every, int64_t log_every = 1) {
  return {.steps = steps, .eval_every = eval_every, .checkpoint_every = checkpoint_every, .log_every = log_every};
}

using V = std::vector<int64_t>;

TEST(Cadence, ValidatesAtMultiplesOfEvalEveryAndAtTheLastStep) {
  EXPECT_EQ(run(opts(10, 4, 0), 0, kPlain).evals, (V{4, 8, 10}));
  EXPECT_EQ(run(opts(8, 4, 0), 0, kPlain).evals, (V{4, 8}));
  EXPECT_EQ(run(opts(10, 1, 0), 7, kPlain).evals, (V{8, 9, 10}));
  EXPECT_EQ(run(opts(10, 0, 0), 0, kPlain).evals, V{});  // 0: never, not even at the end
}

TEST(Cadence, SavesAtMultiplesOfCheckpointEveryAndAtTheLastStep) {
  const Trace t = run(opts(10, 0, 4), 0, kPlain);
  EXPECT_EQ(t.saves, (V{4, 8, 10}));
  EXPECT_FALSE(t.final_save);
  EXPECT_EQ(t.end, 10);
  EXPECT_FALSE(t.stopped);
  EXPECT_EQ(run(opts(10, 0, 0), 0, kPlain).saves, V{10});  // 0: at the end only
  EXPECT_EQ(run(opts(10, 0, 1), 0, kPlain).saves, (V{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
}

TEST(Cadence, AResumedRunCountsFromItsFirstStep) {
  const Trace t = run(opts(10, 4, 4), 6, kPlain);
  EXPECT_EQ(t.evals, (V{8, 10}));
  EXPECT_EQ(t.saves, (V{8, 10}));
  // A run resumed at its end takes no step and saves at its end.
  const Trace done = run(opts(10, 4, 4), 10, kPlain);
  EXPECT_EQ(done.saves, V{});
  EXPECT_TRUE(done.final_save);
}

TEST(Cadence, RowsEveryLogEveryAtTheLastStepAndWhereTheyAreNotable) {
  EXPECT_EQ(run(opts(10, 0, 0, 3), 0, kPlain).rows, (V{3, 6, 9, 10}));
  EXPECT_EQ(run(opts(10, 4, 5, 3), 0, kPlain).rows, (V{3, 4, 5, 6, 8, 9, 10}));  // + validated 4, 8; saved 5
}

TEST(Cadence, StopAfterEndsTheRunWithoutACheckpoint) {
  CadenceOptions o = opts(10, 0, 0);
  o.stop_after = 4;
  const Trace t = run(o, 0, kPlain);
  EXPECT_EQ(t.end, 4);
  EXPECT_FALSE(t.stopped);
  EXPECT_EQ(t.saves, V{});
  EXPECT_TRUE(t.final_save);  // the end saves step 4
  o.checkpoint_every = 2;
  EXPECT_FALSE(run(o, 0, kPlain).final_save);  // step 4's checkpoint was written
  o.stop_after = 10;
  EXPECT_EQ(run(o, 0, kPlain).end, 10);  // at or past the last step: the run ends as it would
}

TEST(Cadence, AStopRequestEndsTheRunAfterItsCheckpoint) {
  const Trace t = run(opts(10, 0, 0), 0, [](int64_t step) { return Turn{.stop = step >= 2}; });
  EXPECT_EQ(t.saves, V{3});
  EXPECT_EQ(t.rows.back(), 3);
  EXPECT_EQ(t.end, 3);
  EXPECT_TRUE(t.stopped);
  EXPECT_FALSE(t.final_save);
}

TEST(Cadence, AStopRequestIsNotAskedAtTheLastStep) {
  const Trace t = run(opts(3, 0, 0), 0, [](int64_t) { return Turn{.can_checkpoint = false, .stop = true}; });
  EXPECT_EQ(t.stop_asked, (V{1, 2}));  // the last step ends the run anyway
  EXPECT_FALSE(t.stopped);
  EXPECT_EQ(t.end, 3);
}

TEST(Cadence, CanCheckpointFalseDelaysADueCheckpoint) {
  // Due at 4 (an exchange in flight until step 6): written at 6, then the cadence goes on from 8.
  const Trace t = run(opts(10, 0, 4), 0, [](int64_t step) { return Turn{.can_checkpoint = step >= 5}; });
  EXPECT_EQ(t.saves, (V{6, 8, 10}));
  EXPECT_EQ(t.can_asked, (V{4, 5, 6, 8, 10}));  // asked only while one is due
  EXPECT_EQ(t.rows, (V{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
}

TEST(Cadence, AStopWaitsForItsDelayedCheckpoint) {
  // Stop requested at step 3, checkpoints refused until step 5: the run goes on to 5, saves, stops.
  const Trace t =
      run(opts(10, 0, 0), 0, [](int64_t step) { return Turn{.can_checkpoint = step >= 4, .stop = step >= 2}; });
  EXPECT_EQ(t.saves, V{5});
  EXPECT_EQ(t.end, 5);
  EXPECT_TRUE(t.stopped);
}

TEST(Cadence, ASkippedBatchDoesNotCount) {
  int calls = 0;
  const Trace t = run(opts(4, 2, 2), 0, [&](int64_t step) { return Turn{.skip = step == 1 && calls++ < 3}; });
  EXPECT_EQ(t.evals, (V{2, 4}));
  EXPECT_EQ(t.saves, (V{2, 4}));
  EXPECT_EQ(t.rows, (V{1, 2, 3, 4}));
  EXPECT_EQ(calls, 4);
}

// Islands on a time budget: a slow island adopts the round's furthest step at a commit.
TEST(Cadence, AJumpAheadValidatesWhereTheStepCrossedAMultiple) {
  // 3 -> 7 crosses 5; 8 -> 11 crosses 10; 11 -> 12 crosses nothing; 14 -> 15 lands on 15.
  const Trace t = run(opts(20, 5, 0), 0, [](int64_t step) { return Turn{.jump = step == 3 ? 3 : step == 8 ? 2 : 0}; });
  EXPECT_EQ(t.evals, (V{7, 11, 15, 20}));
}

TEST(Cadence, AJumpAheadSavesOnlyWhereTheStepsAgree) {
  // Commits (the steps agree) at steps 4, 11, 16 and 20 (the last), two of them jumps: 9 -> 11
  // and 14 -> 16. 4 is a multiple; 8 was crossed at step 8, where the steps did not agree: due
  // at the next commit, 11 (counted from the commit at 4, not from 8, where that step started);
  // 12 and 16 between 11 and 16: one save; the last step.
  const std::vector<int64_t> commits = {3, 8, 13, 19};  // the turns' first steps
  const Trace t = run(opts(20, 0, 4), 0, [&](int64_t step) {
    const bool commit = std::find(commits.begin(), commits.end(), step) != commits.end();
    return Turn{.jump = step == 8 || step == 13 ? 2 : 0, .agreed = commit};
  });
  EXPECT_EQ(t.saves, (V{4, 11, 16, 20}));
  EXPECT_EQ(t.end, 20);
  EXPECT_FALSE(t.final_save);
}

TEST(Cadence, AJumpToTheLastStepSavesThere) {
  const Trace t = run(opts(10, 0, 0), 0, [](int64_t step) { return Turn{.jump = step == 6 ? 3 : 0}; });
  EXPECT_EQ(t.saves, V{10});
  EXPECT_EQ(t.end, 10);
  EXPECT_EQ(t.rows.back(), 10);
}

TEST(Cadence, AStopRequestWaitsForTheStepsToAgree) {
  // Asked to stop from step 3 on, the steps agree only at step 6: the run goes on to it, saves it
  // and stops there.
  const Trace t = run(opts(10, 0, 0), 0, [](int64_t step) { return Turn{.agreed = step == 5, .stop = step >= 2}; });
  EXPECT_EQ(t.saves, V{6});
  EXPECT_EQ(t.end, 6);
  EXPECT_TRUE(t.stopped);
}

// The driver's loop before the split (driver.cc run_steps at b3bd663), its decisions only: a
// second statement of the cadence's rules, in the shape the driver had. Its callers asked for a
// stop only where the steps agree (the islands' stop_requested said so; a single process always
// agrees), a rule the cadence now keeps itself.
Trace reference(const CadenceOptions& o, int64_t step, const Script& script) {
  Trace t;
  bool saved = false, checkpoint_due = false, agreed = true;
  auto crossed = [&](int64_t every, int64_t from) { return every > 0 && step / every > from / every; };
  int64_t agreed_at = step;
  for (int turns = 0; step < o.steps && turns < 1000; ++turns) {
    const Turn turn = script(step);
    const int64_t before = step;
    if (agreed) agreed_at = before;
    if (turn.skip) continue;
    step += 1 + turn.jump;
    agreed = turn.agreed;
    const bool last = step == o.steps;
    const bool eval = o.eval_every > 0 && (crossed(o.eval_every, before) || last);
    if (eval) t.evals.push_back(step);
    // A stop request as the islands' driver asked it: where the steps agree only.
    const bool stopping = !last && (t.stop_asked.push_back(step), turn.stop) && agreed;
    if (agreed) {
      checkpoint_due = checkpoint_due || crossed(o.checkpoint_every, agreed_at) || last || stopping;
      agreed_at = step;
    }
    bool saved_now = false;
    if (checkpoint_due && (t.can_asked.push_back(step), turn.can_checkpoint))
      saved_now = saved = true, checkpoint_due = false, t.saves.push_back(step);
    if (step % o.log_every == 0 || last || eval || saved_now) t.rows.push_back(step);
    if (stopping && !checkpoint_due) {
      t.stopped = true;
      break;
    }
    if (o.stop_after > 0 && step >= o.stop_after && !last) break;
  }
  t.end = step;
  t.final_save = !saved;
  return t;
}

// Every run of up to 7 steps, every cadence of up to 3, from every first step, under scripts of
// random hooks (jumps, disagreement, refused checkpoints, stop requests, skipped batches).
TEST(Cadence, EverySmallCaseAsTheDriverDecidedBeforeTheSplit) {
  std::mt19937 rng(36);
  int cases = 0;
  for (int64_t steps = 1; steps <= 7; ++steps)
    for (int64_t start = 0; start < steps; ++start)
      for (int64_t eval = 0; eval <= 3; ++eval)
        for (int64_t every = 0; every <= 3; ++every)
          for (int64_t log = 1; log <= 3; ++log)
            for (int64_t stop_after : {0, 2, 5})
              for (int seed = 0; seed < 6; ++seed) {
                CadenceOptions o = opts(steps, eval, every, log);
                o.stop_after = stop_after;
                std::vector<Turn> turns(40);
                for (Turn& u : turns)
                  u = {.jump = rng() % 4 == 0 ? int64_t(rng() % 3) + 1 : 0,
                       .agreed = seed == 0 || rng() % 3 != 0,
                       .can_checkpoint = seed == 0 || rng() % 3 != 0,
                       .stop = seed > 1 && rng() % 6 == 0,
                       .skip = seed > 2 && rng() % 5 == 0};
                size_t at = 0;  // the turns come in order, whatever step they start from
                auto script = [&](int64_t) { return turns[at++ % turns.size()]; };
                const Trace want = reference(o, start, script);
                at = 0;
                const Trace got = run(o, start, script);
                ASSERT_EQ(got, want) << "steps " << steps << " from " << start << ", eval_every " << eval
                                     << ", checkpoint.every " << every << ", log_every " << log << ", stop_after "
                                     << stop_after << ", seed " << seed;
                ++cases;
              }
  EXPECT_EQ(cases, 28 * 4 * 4 * 3 * 3 * 6);
}

}  // namespace
}  // namespace atl
