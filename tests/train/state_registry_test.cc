// The state registry and the checkpoint walks over it (train/state_registry.h,
// train/state_checkpoint.h), on one worker's live state: every entry saved and restored bit for
// bit (a run without DiLoCo and one with it, error feedback on), version-1 checkpoints of both old
// kinds loaded, a single-process checkpoint resumed by a DiLoCo run, and the resume check's
// refusals naming the field and the fix. DiLoCo's state lives in a DilocoSync over an outer group
// of one island (a real group on the suite's redis-server).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <set>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/ckpt/file_io.h"
#include "atoll/core/errors.h"
#include "atoll/dist/store.h"
#include "atoll/train/dataset.h"
#include "atoll/train/state_checkpoint.h"
#include "data/temp_dir.h"
#include "data/text_gen.h"
#include "dist/dist_test_util.h"

namespace atl {
namespace {

using nlohmann::json;

class StateRegistryTest : public testing::RedisSuite {
 protected:
  static void SetUpTestSuite() {
    RedisSuite::SetUpTestSuite();
    data_ = new testing::TempDir();
    std::string text;
    for (const auto& d : testing::make_docs(1500, 3)) text += d + "\n";
    testing::write_file(*data_ / "corpus.txt", text);
    resolve_dataset(config());
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
    RedisSuite::TearDownTestSuite();
  }
  static Config config() {
    Config c;
    ModelConfig& m = c.model;
    m.vocab_size = 384, m.dim = 16, m.n_layers = 2, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 8;
    m.n_experts = 2, m.top_k = 1, m.expert_hidden = 16, m.seq_len = 16;
    c.train.batch_size = 2;
    c.data.input = {*data_ / "corpus.txt"};
    c.data.dir = *data_ / "data";
    c.diloco.codec = "int8";
    c.diloco.error_feedback = true;
    return c;
  }
  inline static testing::TempDir* data_ = nullptr;
  testing::TempDir run_;
};

// One worker's live state: the loop, and with DiLoCo a DilocoSync over an outer group of one.
struct Worker {
  // expert_slots > 0: the outer step weighs experts by their tokens (diloco.expert_merge). `plan`:
  // streaming DiLoCo's fragments (empty: one).
  Worker(const Config& c, bool with_diloco, const StoreOptions& store_opts, size_t expert_slots = 0,
         FragmentPlan plan = {})
      : cfg(c), loop(c, c.data.dir) {
    loop.engine->init_params(1);
    if (!with_diloco) return;
    store = std::make_unique<Store>(store_opts);
    group = std::make_unique<ProcessGroup>(*store, GroupOptions{.name = "outer-r0"});
    diloco = std::make_unique<DilocoSync>(
        *group, loop.engine->host().params, loop.engine->layout().total(),
        DilocoOptions{.ring = {.codec = Codec::kInt8, .error_feedback = true}, .expert_slots = expert_slots},
        std::move(plan));
    state.diloco = diloco.get();
  }
  // Every entry set to values drawn from `seed` (the loader moved on by `seed` batches).
  void scramble(int seed) {
    const size_t n = loop.engine->layout().total();
    const HostBuffers h = loop.engine->host();
    auto fill = [&](float* x, int k) {
      for (size_t i = 0; i < n; ++i)
        x[i] = float((i * 7919 + size_t(seed) * 104729 + size_t(k) * 31) % 1000) / 997.0f - 0.5f;
    };
    fill(h.params, 0), fill(h.m, 1), fill(h.v, 2);
    loop.step = 10 + seed, loop.tokens = 1000 * seed, loop.engine->set_optimizer_steps(7 + seed);
    for (int i = 0; i < seed; ++i) loop.train_data.next_batch(2, loop.in.data(), loop.tg.data());
    if (!diloco) return;
    fill(diloco->theta().data(), 3), fill(diloco->momentum().data(), 4);
    std::vector<float> r(n);
    fill(r.data(), 5);
    diloco->set_residual(r.data());
    diloco->set_fragment_outer_steps(std::vector<int64_t>(size_t(diloco->fragments()), int64_t(3 * seed)));
  }
  std::vector<StateEntry> entries() { return state_registry(cfg, diloco != nullptr, &state); }
  std::string hash(const StateEntry& e) { return state_hash({e}, loop.engine->layout(), {e.division}); }

  const Config& cfg;
  Loop loop;
  std::unique_ptr<Store> store;
  std::unique_ptr<ProcessGroup> group;
  std::unique_ptr<DilocoSync> diloco;
  TrainingState state{.loop = loop};
};

// The manifest of `dir` rewritten as the version-1 code wrote it: a single-process run's state
// {step, tokens, optimizer_step, loader}, or a multi-island run's, which added the loaders by
// global worker index, the shape, the fragment count and whether a residual was saved.
void rewrite_as_version_1(const std::string& dir, bool multi_island) {
  json m = read_checkpoint_manifest(dir);
  m["format_version"] = 1;
  for (const char* key : {"islands", "workers_per_island", "entries"}) m.erase(key);
  json& st = m["state"];
  st["loader"] = st["loaders"][0];
  if (multi_island) {
    st["islands"] = 1, st["workers_per_island"] = 1, st["error_feedback_residual"] = true;
    st["fragments"] = st["fragment_outer_steps"].size();
  } else {
    st.erase("loaders");
  }
  write_text_file(dir + "/manifest.json", m.dump(1) + "\n", true);
}

std::string refusal(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

TEST_F(StateRegistryTest, DeclaresEachPieceOnceWithItsDivision) {
  const Config cfg = config();
  std::set<std::string> names;
  for (const StateEntry& e : state_registry(cfg, true, nullptr)) {
    EXPECT_TRUE(names.insert(e.name).second) << e.name << " declared twice";
    EXPECT_FALSE(e.owner.empty() || e.what.empty()) << e.name;
    EXPECT_TRUE(e.type == StateType::kTensor ? bool(e.data) != bool(e.read) : bool(e.get)) << e.name;
  }
  EXPECT_EQ(names, (std::set<std::string>{"param", "adam_m", "adam_v", "step", "tokens", "optimizer_step", "loaders",
                                          "diloco_theta", "diloco_momentum", "diloco_residual", "fragment_outer_steps",
                                          "outer_step"}));
  EXPECT_EQ(state_registry(cfg, false, nullptr).size(), 7u);  // `atoll train`: no DiLoCo state
}

TEST_F(StateRegistryTest, EveryEntryRoundTripsBitForBit) {
  const Config cfg = config();
  for (const bool diloco : {false, true}) {
    SCOPED_TRACE(diloco ? "with DiLoCo" : "single process");
    Worker a(cfg, diloco, store_options(diloco ? "rt-a" : "")), b(cfg, diloco, store_options(diloco ? "rt-b" : ""));
    a.scramble(1), b.scramble(2);
    const std::string dir = save_training_state(cfg, run_ / (diloco ? "d" : "s"), a.state, {});
    const json manifest = read_training_manifest(dir);
    EXPECT_EQ(manifest["format_version"], kCheckpointFormatVersion);
    check_resume(manifest, dir, cfg, 1, 1, diloco);
    const auto ea = a.entries(), eb = b.entries();
    for (size_t i = 0; i < ea.size(); ++i) {
      EXPECT_TRUE(manifest["entries"].contains(ea[i].name)) << ea[i].name;
      EXPECT_NE(a.hash(ea[i]), b.hash(eb[i])) << ea[i].name << ": the test must start from a different value";
    }
    EXPECT_EQ(manifest["entries"].size(), ea.size());
    restore_training_state(dir, manifest, cfg, b.state, {});
    for (size_t i = 0; i < ea.size(); ++i) EXPECT_EQ(a.hash(ea[i]), b.hash(eb[i])) << ea[i].name;
    EXPECT_EQ(a.loop.train_data.cursor(), b.loop.train_data.cursor());
  }
}

// diloco.outer_delay = 1: the pending flag, the island's Δ in flight and its eager start are
// saved and restored bit for bit (what a resumed run starts its exchange again from), and a
// checkpoint without them resumes with nothing in flight.
TEST_F(StateRegistryTest, TheDelayedOuterStepsStateRoundTripsBitForBit) {
  Config cfg = config();
  cfg.diloco.error_feedback = false;
  cfg.diloco.outer_delay = 1;
  Worker a(cfg, true, store_options("delay-a")), b(cfg, true, store_options("delay-b"));
  const size_t n = a.loop.engine->layout().total();
  OuterDelay da(n), db(n);
  a.state.delay = &da, b.state.delay = &db;
  for (size_t i = 0; i < n; ++i)
    a.diloco->delta(0)[i] = float(i % 97) / 89.0f - 0.5f, da.start()[i] = float(i % 53) / 51.0f + 0.25f;
  da.set_pending(true);
  const std::string dir = save_training_state(cfg, run_ / "delay", a.state, {});
  const json manifest = read_training_manifest(dir);
  EXPECT_EQ(manifest["state"]["diloco_delay_pending"], true);
  restore_training_state(dir, manifest, cfg, b.state, {});
  EXPECT_TRUE(db.pending());
  EXPECT_EQ(hash_floats(b.diloco->delta(0).data(), n), hash_floats(a.diloco->delta(0).data(), n));
  EXPECT_EQ(hash_floats(db.start().data(), n), hash_floats(da.start().data(), n));
  // A checkpoint of a run without the delay: nothing in flight.
  Config plain = cfg;
  plain.diloco.outer_delay = 0;
  const std::string old = save_training_state(plain, run_ / "plain", a.state, {});
  restore_training_state(old, read_training_manifest(old), cfg, b.state, {});
  EXPECT_FALSE(db.pending());
}

// diloco.outer_delay = 1 with error feedback and per-expert token weights: while a Δ is pending,
// a checkpoint saves the residual as it was before that Δ's exchange (the copy DelayInputs took
// as it started), not the live one the exchange moves on meanwhile, and the island's expert
// counts the exchange carries; a restore brings both back, the residual into the ring, where the
// resumed run's exchange starts from. With nothing pending the live residual is saved.
TEST_F(StateRegistryTest, TheStateAnExchangeInFlightReadsIsSavedAsItWasBeforeIt) {
  Config cfg = config();
  cfg.diloco.outer_delay = 1;
  cfg.diloco.expert_merge = "tokens";
  const size_t slots = size_t(cfg.model.n_layers) * size_t(cfg.model.n_experts);
  Worker a(cfg, true, store_options("inputs-a"), slots), b(cfg, true, store_options("inputs-b"), slots);
  a.scramble(1), b.scramble(2);
  const size_t n = a.loop.engine->layout().total();
  OuterDelay da(n), db(n);
  a.state.delay = &da, b.state.delay = &db;
  std::vector<float> before(n), after(n, 0.125f), got(n);
  a.diloco->residual(before.data());
  const std::vector<std::vector<double>> counts = {{3, 0, 5, 8}};
  ASSERT_EQ(counts[0].size(), slots);
  a.diloco->set_snapshot_counts(counts);
  da.set_pending(true);
  da.inputs().take(*a.diloco);
  a.diloco->set_residual(after.data());  // what the exchange in flight leaves behind
  const std::string dir = save_training_state(cfg, run_ / "inputs", a.state, {});
  const json manifest = read_training_manifest(dir);
  EXPECT_EQ(manifest["state"]["diloco_delay_expert_counts"], json::array({counts}));
  restore_training_state(dir, manifest, cfg, b.state, {});
  EXPECT_TRUE(db.pending());
  b.diloco->residual(got.data());
  EXPECT_EQ(hash_floats(got.data(), n), hash_floats(before.data(), n)) << "the residual before the exchange";
  EXPECT_EQ(b.diloco->snapshot_counts(), counts);
  // Nothing pending: the residual saved is the live one.
  da.set_pending(false);
  const std::string idle = save_training_state(cfg, run_ / "idle", a.state, {});
  restore_training_state(idle, read_training_manifest(idle), cfg, b.state, {});
  b.diloco->residual(got.data());
  EXPECT_EQ(hash_floats(got.data(), n), hash_floats(after.data(), n));
}

// diloco.outer_delay = 1 with 2 fragments, fragment 0's exchange in flight and fragment 1's not:
// diloco_delay_pending is a flag per fragment, diloco_delay_delta holds each fragment's Δ in its
// ranges of θ's layout (given back to the fragments before a resume), and the residual is fragment
// 0's as it was before its exchange (the copy of its ranges) beside fragment 1's live one.
TEST_F(StateRegistryTest, WithFragmentsEachFragmentsDelayedStateRoundTrips) {
  Config cfg = config();
  cfg.diloco.outer_delay = 1;
  cfg.diloco.fragments = 2;
  const Worker shape(cfg, false, {});
  std::vector<TensorSpan> spans;
  for (const ParamEntry& e : shape.loop.engine->layout().entries())
    spans.push_back({e.name, e.offset, e.numel, e.layer});
  const size_t n = shape.loop.engine->layout().total();
  const FragmentPlan plan = plan_fragments(spans, n, 2);
  Worker fa(cfg, true, store_options("frag-fa"), 0, plan), fb(cfg, true, store_options("frag-fb"), 0, plan);
  fa.scramble(1), fb.scramble(2);
  OuterDelay da(plan), db(plan);
  fa.state.delay = &da, fb.state.delay = &db;
  for (int f = 0; f < 2; ++f) {
    std::vector<float>& d = fa.diloco->delta(f);
    for (size_t i = 0; i < d.size(); ++i) d[i] = float((i + size_t(f) * 7) % 97) / 89.0f - 0.5f;
    da.keep_delta(*fa.diloco, f);
  }
  std::vector<float> before(n), after(n, 0.125f), want(n), got(n);
  fa.diloco->residual(before.data());
  da.set_pending(0, true);
  da.inputs().take(*fa.diloco, 0);
  fa.diloco->set_residual(after.data());  // fragment 0's exchange moves its residual; fragment 1's moved too
  fa.diloco->residual(want.data(), 1);    // fragment 1's ranges: the live one
  for (const ElementRange& r : plan.ranges[0])
    std::copy(before.begin() + long(r.begin), before.begin() + long(r.end), want.begin() + long(r.begin));
  const std::string dir = save_training_state(cfg, run_ / "fragments", fa.state, {});
  const json manifest = read_training_manifest(dir);
  EXPECT_EQ(manifest["state"]["diloco_delay_pending"], json::array({true, false}));
  restore_training_state(dir, manifest, cfg, fb.state, {});
  EXPECT_EQ(db.pending_list(), std::vector<bool>({true, false}));
  fb.diloco->residual(got.data());
  EXPECT_EQ(hash_floats(got.data(), n), hash_floats(want.data(), n));
  EXPECT_NE(hash_floats(want.data(), n), hash_floats(after.data(), n));  // the copy is used: the test can tell
  db.restore_deltas(*fb.diloco);
  for (int f = 0; f < 2; ++f) EXPECT_EQ(fb.diloco->delta(f), fa.diloco->delta(f)) << "fragment " << f;
}

TEST_F(StateRegistryTest, VersionOneCheckpointsOfBothKindsStillLoad) {
  const Config cfg = config();
  for (const bool diloco : {false, true}) {
    SCOPED_TRACE(diloco ? "multi-island kind" : "single-process kind");
    Worker a(cfg, diloco, store_options(diloco ? "v1-a" : "")), b(cfg, diloco, store_options(diloco ? "v1-b" : ""));
    a.scramble(1), b.scramble(2);
    const std::string dir = save_training_state(cfg, run_ / (diloco ? "d" : "s"), a.state, {});
    rewrite_as_version_1(dir, diloco);
    ASSERT_EQ(read_checkpoint_manifest(dir)["format_version"], 1);
    const json manifest = read_training_manifest(dir);
    EXPECT_EQ(manifest["islands"], 1);
    EXPECT_EQ(manifest["workers_per_island"], 1);
    check_resume(manifest, dir, cfg, 1, 1, diloco);
    restore_training_state(dir, manifest, cfg, b.state, {});
    const auto ea = a.entries(), eb = b.entries();
    for (size_t i = 0; i < ea.size(); ++i) EXPECT_EQ(a.hash(ea[i]), b.hash(eb[i])) << ea[i].name;
  }
}

TEST_F(StateRegistryTest, SingleProcessCheckpointStartsDiLoCoFromItsParameters) {
  const Config cfg = config();
  Worker a(cfg, false, {}), b(cfg, true, store_options("cross"));
  a.scramble(1);
  const std::string dir = save_training_state(cfg, run_.path().string(), a.state, {});
  const json manifest = read_training_manifest(dir);
  check_resume(manifest, dir, cfg, 1, 1, /*diloco=*/true);
  restore_training_state(dir, manifest, cfg, b.state, {});
  const ParamLayout& layout = a.loop.engine->layout();
  for (const ParamEntry& p : layout.entries()) {
    const float* want = a.loop.engine->host().params + p.offset;
    EXPECT_EQ(std::memcmp(b.loop.engine->host().params + p.offset, want, p.numel * sizeof(float)), 0) << p.name;
    EXPECT_EQ(std::memcmp(b.diloco->theta().data() + p.offset, want, p.numel * sizeof(float)), 0) << p.name;
  }
  for (float m : b.diloco->momentum()) ASSERT_EQ(m, 0.0f);
  EXPECT_EQ(b.diloco->outer_step(), 0);
  EXPECT_EQ(b.loop.step, a.loop.step);
}

TEST_F(StateRegistryTest, ResumeCheckNamesTheFieldAndTheFix) {
  Config cfg = config();
  Worker a(cfg, true, store_options("check"));
  a.scramble(1);
  const std::string dir = save_training_state(cfg, run_.path().string(), a.state, {});
  const json good = read_training_manifest(dir);
  auto has = [](const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; };

  // A DiLoCo run resumes on another shape (state_checkpoint.h); `atoll train` only from 1 x 1.
  EXPECT_NO_THROW(check_resume(good, dir, cfg, 2, 1, true));
  EXPECT_NO_THROW(check_resume(good, dir, cfg, 1, 3, true));
  std::string msg;
  json shaped = good;
  shaped["islands"] = 2, shaped["workers_per_island"] = 2;
  msg = refusal([&] { check_resume(shaped, dir, cfg, 1, 1, /*diloco=*/false); });
  EXPECT_TRUE(has(msg, "not a single-process run") &&
              has(msg, "atoll launch --islands 2 --workers-per-island 2 --resume"))
      << msg;

  json missing = good;
  missing["entries"].erase("adam_v");
  msg = refusal([&] { check_resume(missing, dir, cfg, 1, 1, true); });
  EXPECT_TRUE(has(msg, "has no adam_v") && has(msg, "entries.adam_v") && has(msg, "fix:")) << msg;

  json bad_cursor = good;
  bad_cursor["state"]["loaders"][0].erase("epoch");
  msg = refusal([&] { check_resume(bad_cursor, dir, cfg, 1, 1, true); });
  EXPECT_TRUE(has(msg, "state.loaders") && has(msg, "not a data cursor")) << msg;

  Config two = cfg;
  two.diloco.fragments = 2;
  msg = refusal([&] { check_resume(good, dir, two, 1, 1, true); });
  EXPECT_TRUE(has(msg, "diloco.fragments = 1, not 2") && has(msg, "--set diloco.fragments=1")) << msg;
}

}  // namespace
}  // namespace atl
