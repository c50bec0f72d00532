#include "atoll/ckpt/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "atoll/ckpt/file_io.h"
#include "atoll/ckpt/safetensors.h"
#include "atoll/core/errors.h"
#include "ckpt/ckpt_test_util.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::has;
using testing::ScratchDir;

// A small model's training state: parameters and two Adam moments, each filled with its own
// pattern, plus a state object with the awkward values a resume depends on.
struct State {
  Config cfg;
  ParamLayout layout;
  std::vector<float> param, m, v;
  json extra;

  explicit State(const ModelConfig& model, int seed = 1) {
    cfg.model = model;
    layout = ParamLayout::build(model);
    param = testing::pattern(layout.total(), seed);
    m = testing::pattern(layout.total(), seed + 10);
    v = testing::pattern(layout.total(), seed + 20);
    extra = {{"data", {{"shard", 3}, {"position", 123456789012LL}}},
             {"rng", {{"state", 0xfedcba9876543210ULL}, {"inc", 1ULL}}},
             {"lr", 0.1 + 0.2},  // not exactly representable: checks shortest round-trip printing
             {"step", 30}};
  }
  std::vector<CheckpointBuffer> buffers() { return {{"param", param.data()}, {"adam_m", m.data()}, {"adam_v", v.data()}}; }
  std::string save(const std::string& run_dir, int64_t step, int keep = 3) {
    return save_checkpoint({.run_dir = run_dir, .step = step, .keep = keep}, cfg, layout, buffers(), extra);
  }
};

// Every tensor of `a` equals `b` bit for bit (padding between tensors is not saved).
void expect_same_tensors(const ParamLayout& layout, const std::vector<float>& a, const std::vector<float>& b) {
  for (const auto& e : layout.entries())
    EXPECT_EQ(std::memcmp(a.data() + e.offset, b.data() + e.offset, e.numel * sizeof(float)), 0) << e.name;
}

// Loads `dir` into a state whose buffers hold another pattern; expects CorruptCheckpoint whose
// message contains every part of `expect`, and the buffers left exactly as they were.
void expect_corrupt(const std::string& dir, const ModelConfig& model, const std::vector<std::string>& expect) {
  State dst(model, /*seed=*/7);
  const State before = dst;
  try {
    load_checkpoint(dir, model, dst.layout, dst.buffers());
    ADD_FAILURE() << "no CorruptCheckpoint for " << dir;
  } catch (const CorruptCheckpoint& e) {
    for (const auto& part : expect) EXPECT_TRUE(has(e.what(), part)) << "missing '" << part << "' in: " << e.what();
  }
  EXPECT_EQ(dst.param, before.param);
  EXPECT_EQ(dst.m, before.m);
  EXPECT_EQ(dst.v, before.v);
}

TEST(Checkpoint, SaveLoadRoundTripIsBitExact) {
  ScratchDir run;
  State src(testing::small_model());
  std::string dir = src.save(run.str(), 30);
  EXPECT_EQ(dir, run / "checkpoints/step-00000030");
  EXPECT_TRUE(fs::exists(dir + "/manifest.json"));

  State dst(testing::small_model(), /*seed=*/5);
  json state = load_checkpoint(dir, dst.cfg.model, dst.layout, dst.buffers());
  expect_same_tensors(src.layout, src.param, dst.param);
  expect_same_tensors(src.layout, src.m, dst.m);
  expect_same_tensors(src.layout, src.v, dst.v);
  EXPECT_EQ(state, src.extra);
  EXPECT_EQ(state["rng"]["state"].get<uint64_t>(), 0xfedcba9876543210ULL);
  EXPECT_EQ(state["lr"].get<double>(), 0.1 + 0.2);
  EXPECT_EQ(config_to_toml(read_checkpoint_config(dir)), config_to_toml(src.cfg));
}

TEST(Checkpoint, FileHoldsNamedTensorsWithRealShapes) {
  ScratchDir run;
  State src(testing::small_model());
  std::string dir = src.save(run.str(), 1);
  auto r = SafetensorsReader::open(dir + "/rank-00000.safetensors");
  EXPECT_EQ(r.header().tensors.size(), 3 * src.layout.entries().size());
  const TensorInFile* wq = r.find("param/layers.0.attn.wq");
  ASSERT_NE(wq, nullptr);
  EXPECT_EQ(wq->shape, (std::vector<int64_t>{16, 16}));
  const TensorInFile* w2 = r.find("adam_m/layers.1.moe.w2");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w2->shape, (std::vector<int64_t>{4, 16, 24}));
  json man = read_checkpoint_manifest(dir);
  EXPECT_EQ(man["step"], 1);
  EXPECT_EQ(man["tensors"]["adam_m/layers.1.moe.w2"]["offset"].get<size_t>(), w2->file_offset);
  EXPECT_EQ(man["tensors"]["adam_m/layers.1.moe.w2"]["xxh3"].get<std::string>().size(), 16u);
  EXPECT_EQ(man["files"]["rank-00000.safetensors"]["bytes"].get<uint64_t>(),
            fs::file_size(dir + "/rank-00000.safetensors"));
}

TEST(Checkpoint, LoadsASubsetOfKinds) {
  ScratchDir run;
  State src(testing::small_model());
  std::string dir = src.save(run.str(), 2);
  State dst(testing::small_model(), 5);
  load_checkpoint(dir, dst.cfg.model, dst.layout, {{"param", dst.param.data()}});
  expect_same_tensors(src.layout, src.param, dst.param);
}

TEST(Checkpoint, LatestIsUpdatedAndKeepPrunesOldOnes) {
  ScratchDir run;
  State src(testing::small_model());
  for (int64_t step : {10, 20, 30, 40}) src.save(run.str(), step, /*keep=*/2);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(run / "checkpoints")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000030", "step-00000040"}));
  EXPECT_EQ(read_text_file(run / "checkpoints/latest"), "step-00000040\n");
  EXPECT_EQ(latest_checkpoint(run.str()), run / "checkpoints/step-00000040");
  EXPECT_EQ(resolve_checkpoint(run.str()), run / "checkpoints/step-00000040");

  // A directory without a manifest is not a checkpoint: never latest, never pruned.
  fs::create_directories(run / "checkpoints/step-00000090");
  src.save(run.str(), 50, /*keep=*/1);
  EXPECT_FALSE(fs::exists(run / "checkpoints/step-00000040"));
  EXPECT_TRUE(fs::exists(run / "checkpoints/step-00000090"));
  EXPECT_EQ(latest_checkpoint(run.str()), run / "checkpoints/step-00000050");
  // A "latest" naming a broken directory falls back to the newest complete checkpoint.
  write_text_file(run / "checkpoints/latest", "step-00000090\n", false);
  EXPECT_EQ(latest_checkpoint(run.str()), run / "checkpoints/step-00000050");
  EXPECT_EQ(latest_checkpoint(run / "nothing-here"), "");
}

TEST(Checkpoint, SavingTheSameStepAgainReplacesIt) {
  ScratchDir run;
  State a(testing::small_model(), 1), b(testing::small_model(), 2);
  a.save(run.str(), 10);
  std::string dir = b.save(run.str(), 10);
  State dst(testing::small_model(), 5);
  load_checkpoint(dir, dst.cfg.model, dst.layout, dst.buffers());
  expect_same_tensors(b.layout, b.param, dst.param);
}

TEST(Checkpoint, TruncatedFileIsNamed) {
  ScratchDir run;
  State src(testing::small_model());
  std::string dir = src.save(run.str(), 30);
  fs::resize_file(dir + "/rank-00000.safetensors", fs::file_size(dir + "/rank-00000.safetensors") - 100);
  expect_corrupt(dir, src.cfg.model, {"rank-00000.safetensors", "truncated"});
}

TEST(Checkpoint, FlippedByteFailsTheChecksumOfItsTensor) {
  ScratchDir run;
  State src(testing::small_model());
  std::string dir = src.save(run.str(), 30);
  // Damage the last tensor loaded, so every earlier one has validated before the error.
  const std::string name = "adam_v/final_norm";
  size_t offset = read_checkpoint_manifest(dir)["tensors"][name]["offset"].get<size_t>();
  std::fstream f(dir + "/rank-00000.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset + 5));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset + 5));
  f.put(static_cast<char>(c ^ 0x10));
  f.close();
  expect_corrupt(dir, src.cfg.model, {"rank-00000.safetensors", "tensor '" + name + "'", "checksum"});
}

TEST(Checkpoint, MissingManifestIsNotACheckpoint) {
  ScratchDir run;
  State src(testing::small_model());
  std::string dir = src.save(run.str(), 30);
  fs::remove(dir + "/manifest.json");
  expect_corrupt(dir, src.cfg.model, {"step-00000030", "manifest.json"});
  EXPECT_EQ(latest_checkpoint(run.str()), "");
  EXPECT_THROW(resolve_checkpoint(run.str()), CorruptCheckpoint);
}

TEST(Checkpoint, AnotherModelShapeNamesTheField) {
  ScratchDir run;
  ModelConfig four = testing::small_model();
  four.n_layers = 4;
  std::string dir = State(four).save(run.str(), 30);
  expect_corrupt(dir, testing::small_model(),
                 {"step-00000030", "another model shape", "model.n_layers is 4 there, 2 here", "fix:"});
  ModelConfig tied = testing::small_model(/*tied=*/true);
  tied.n_layers = 4;
  expect_corrupt(dir, tied, {"model.tie_embeddings is false there, true here"});
  // Keys that only steer training may change across a resume.
  ModelConfig other_coef = four;
  other_coef.aux_loss_coef = 0.5;
  State dst(other_coef, 5);
  EXPECT_NO_THROW(load_checkpoint(dir, other_coef, dst.layout, dst.buffers()));
}

TEST(Checkpoint, MissingKindIsNamed) {
  ScratchDir run;
  State src(testing::small_model());
  std::string dir = src.save(run.str(), 30);
  State dst(testing::small_model(), 5);
  std::vector<float> mu(dst.layout.total(), 1.0f);
  EXPECT_THROW(load_checkpoint(dir, dst.cfg.model, dst.layout, {{"param", dst.param.data()}, {"muon_m", mu.data()}}),
               CorruptCheckpoint);
  EXPECT_EQ(dst.param, testing::pattern(dst.layout.total(), 5));  // untouched: muon_m failed validation
}

TEST(Checkpoint, FailedSaveLeavesNoStepDirectory) {
  ScratchDir run;
  State src(testing::small_model());
  src.save(run.str(), 10);
  // Invalid UTF-8 in the state makes the manifest unserialisable: the failure comes after the
  // tensor file was written into the temporary directory, as a crash or a full disk would.
  src.extra["bad"] = std::string("\xff\xfe");
  EXPECT_ANY_THROW(src.save(run.str(), 20));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(run / "checkpoints")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000010"}));
  EXPECT_EQ(latest_checkpoint(run.str()), run / "checkpoints/step-00000010");
}

// Renames the rank file in the manifest (its "files" entry and every tensor's "file") to `file`.
void point_manifest_at(const std::string& dir, const std::string& file) {
  nlohmann::json m = read_checkpoint_manifest(dir);
  nlohmann::json files = nlohmann::json::object();
  files[file] = m["files"].begin().value();  // the one rank file, under whichever name it has now
  m["files"] = files;
  for (auto& [name, meta] : m["tensors"].items()) meta["file"] = file;
  std::ofstream(dir + "/manifest.json", std::ios::trunc) << m.dump();
}

TEST(Checkpoint, FileNamesInTheManifestStayInsideTheCheckpoint) {
  ScratchDir run;
  State src(testing::small_model());
  const std::string dir = src.save(run.str(), 30);
  // An exact copy outside the checkpoint, so only the name's place can make the load fail.
  fs::copy_file(dir + "/rank-00000.safetensors", run / "outside.safetensors");
  fs::create_symlink(run / "outside.safetensors", dir + "/link.safetensors");
  const std::vector<std::string> names = {"../outside.safetensors", run / "outside.safetensors", "link.safetensors"};
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    point_manifest_at(dir, name);
    expect_corrupt(dir, src.cfg.model, {"manifest.json", "file"});
    EXPECT_THROW(verify_checkpoint(dir, src.cfg.model), CorruptCheckpoint);
  }
  // A symbolic link to a file inside the checkpoint is the file itself.
  fs::rename(dir + "/rank-00000.safetensors", dir + "/real.safetensors");
  fs::create_symlink("real.safetensors", dir + "/rank-00000.safetensors");
  point_manifest_at(dir, "rank-00000.safetensors");
  State dst(src.cfg.model, /*seed=*/7);
  load_checkpoint(dir, src.cfg.model, dst.layout, dst.buffers());
  expect_same_tensors(src.layout, src.param, dst.param);
}

TEST(Checkpoint, MalformedTensorShapeInTheManifestIsCorrupt) {
  ScratchDir run;
  State src(testing::small_model());
  const std::string dir = src.save(run.str(), 30);
  nlohmann::json m = read_checkpoint_manifest(dir);
  m["tensors"]["param/embed"]["shape"] = {"64", 16};
  std::ofstream(dir + "/manifest.json", std::ios::trunc) << m.dump();
  expect_corrupt(dir, src.cfg.model, {"param/embed", "shape holds \"64\""});
  EXPECT_THROW(verify_checkpoint(dir, src.cfg.model), CorruptCheckpoint);
}

}  // namespace
}  // namespace atl
