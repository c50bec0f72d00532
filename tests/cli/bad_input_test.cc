// "Bad input: a clear error, nothing lost." Every kind of bad input the command line takes (a
// config, a corpus, token shards, a tokenizer of another vocabulary, a damaged checkpoint or
// one of another model, a run or export folder that holds something else) must give a
// non-zero exit, one stderr line "atoll: error: ..." naming the file (or flag), the field and
// the fix, and leave every file that existed before byte-identical.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  if (at == std::string::npos) throw std::runtime_error("'" + from + "' not in the text");
  return text.replace(at, from.size(), to);
}

// Overwrites `bytes.size()` bytes of `path` at `offset`.
void patch_file(const std::string& path, uint64_t offset, const std::string& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot patch " + path);
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::string b = read_file(path).substr(offset, 1);
  b[0] = static_cast<char>(b[0] ^ 0x5a);
  patch_file(path, offset, b);
}

void truncate_by(const std::string& path, uint64_t bytes) { fs::resize_file(path, fs::file_size(path) - bytes); }

// ---------------------------------------------------------------------------------------------
// Config: unknown keys, wrong types, values out of range, bad syntax, a missing file.

class BadConfig : public CliTest {
 protected:
  // Writes the micro config with `from` replaced by `to` and runs `atoll train` on it (plus
  // `extra`); checks that nothing was created or changed.
  RunResult train_with(const std::string& config_text, const std::vector<std::string>& extra = {}) {
    const std::string cfg = dir("bad.toml");
    write_file(cfg, config_text);
    const auto before = snapshot(dir());
    const auto data_before = snapshot(world().data_dir());
    std::vector<std::string> args = {"train", "--config", cfg, "--run-dir", dir("run"), "--no-sample"};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r = run_atoll(args);
    EXPECT_TRUE(unchanged(before, snapshot(dir())));
    EXPECT_TRUE(unchanged(data_before, snapshot(world().data_dir())));
    EXPECT_FALSE(fs::exists(dir("run"))) << "a run directory was created for a config that does not load";
    return r;
  }
  std::string micro() const { return world().config_text(); }
};

TEST_F(BadConfig, UnknownKeyInFile) {
  const RunResult r = train_with(replace_once(micro(), "[train]\n", "[train]\nstepz = 5\n"));
  EXPECT_TRUE(fails_clearly(r, {dir("bad.toml"), "train.stepz", "train.steps"}));
}

TEST_F(BadConfig, UnknownSectionInFile) {
  const RunResult r = train_with(micro() + "\n[trian]\nsteps = 5\n");
  EXPECT_TRUE(fails_clearly(r, {dir("bad.toml"), "[trian]"}));
}

TEST_F(BadConfig, UnknownKeyInSet) {
  const RunResult r = train_with(micro(), {"--set", "optim.learning_rate=0.1"});
  EXPECT_TRUE(fails_clearly(r, {"--set optim.learning_rate=0.1", "optim.learning_rate"}));
}

TEST_F(BadConfig, MalformedSet) {
  const RunResult r = train_with(micro(), {"--set", "train.steps"});
  EXPECT_TRUE(fails_clearly(r, {"--set train.steps", "key=value"}));
}

TEST_F(BadConfig, WrongTypeInFile) {
  const RunResult r = train_with(replace_once(micro(), "steps = 4", "steps = \"four\""));
  EXPECT_TRUE(fails_clearly(r, {dir("bad.toml"), "train.steps", "integer"}));
}

TEST_F(BadConfig, WrongTypeBooleanInFile) {
  const RunResult r = train_with(replace_once(micro(), "[model]\n", "[model]\ntie_embeddings = 1\n"));
  EXPECT_TRUE(fails_clearly(r, {dir("bad.toml"), "model.tie_embeddings", "true or false"}));
}

TEST_F(BadConfig, WrongTypeInSet) {
  const RunResult r = train_with(micro(), {"--set", "model.dim=wide"});
  EXPECT_TRUE(fails_clearly(r, {"--set", "model.dim", "integer"}));
}

TEST_F(BadConfig, WrongListInFile) {
  const RunResult r = train_with(replace_once(micro(), "input = [\"", "input = [1, \""));
  EXPECT_TRUE(fails_clearly(r, {dir("bad.toml"), "data.input"}));
}

TEST_F(BadConfig, OutOfRangeInFile) {
  const RunResult r = train_with(replace_once(micro(), "n_layers = 2", "n_layers = 0"));
  EXPECT_TRUE(fails_clearly(r, {dir("bad.toml"), "model.n_layers", "out of range"}));
}

TEST_F(BadConfig, OutOfRangeInSet) {
  const RunResult r = train_with(micro(), {"--set", "optim.beta1=1.5"});
  EXPECT_TRUE(fails_clearly(r, {"--set", "optim.beta1", "out of range"}));
}

TEST_F(BadConfig, UnknownChoiceInSet) {
  const RunResult r = train_with(micro(), {"--set", "optim.name=lion"});
  EXPECT_TRUE(fails_clearly(r, {"--set", "optim.name", "lion", "adamw"}));
}

TEST_F(BadConfig, InconsistentValuesInFile) {
  const RunResult r = train_with(replace_once(micro(), "top_k = 2", "top_k = 8"));
  EXPECT_TRUE(fails_clearly(r, {dir("bad.toml"), "model.top_k", "model.n_experts"}));
}

TEST_F(BadConfig, InconsistentValuesInSet) {
  const RunResult r = train_with(micro(), {"--set", "model.n_kv_heads=2", "--set", "model.n_heads=3"});
  EXPECT_TRUE(fails_clearly(r, {dir("bad.toml"), "--set model.n_heads=3", "model.n_kv_heads"}));
}

TEST_F(BadConfig, BadTomlSyntax) {
  const RunResult r = train_with(replace_once(micro(), "[train]\n", "[train\n"));
  // The line of the broken table header: the 13th of the micro config.
  EXPECT_TRUE(fails_clearly(r, {dir("bad.toml") + ":13:", "TOML"}));
}

TEST_F(BadConfig, MissingConfigFile) {
  const auto before = snapshot(dir());
  const RunResult r = run_atoll({"train", "--config", dir("nowhere.toml"), "--run-dir", dir("run")});
  EXPECT_TRUE(fails_clearly(r, {dir("nowhere.toml"), "--config"}));
  EXPECT_TRUE(unchanged(before, snapshot(dir())));
}

TEST_F(BadConfig, ConfigIsAFolder) {
  const auto before = snapshot(dir());
  const RunResult r = run_atoll({"train", "--config", dir(), "--run-dir", dir("run")});
  EXPECT_TRUE(fails_clearly(r, {dir(), "--config"}));
  EXPECT_TRUE(unchanged(before, snapshot(dir())));
}

TEST_F(BadConfig, BadConfigForBench) {
  const RunResult r = run_atoll({"bench", "--config", world().config(), "--set", "model.n_heads=three"});
  EXPECT_TRUE(fails_clearly(r, {"--set", "model.n_heads"}));
}

// ---------------------------------------------------------------------------------------------
// `atoll data prepare`: a missing, empty or non-text input; an output folder that holds
// something else.

class BadPrepare : public CliTest {
 protected:
  RunResult prepare(const std::vector<std::string>& inputs, const std::string& out) {
    const auto before = snapshot(dir());
    std::vector<std::string> args = {"data", "prepare"};
    for (const auto& in : inputs) args.insert(args.end(), {"--input", in});
    args.insert(args.end(), {"--out", out, "--vocab-size", "384"});
    RunResult r = run_atoll(args);
    EXPECT_TRUE(unchanged(before, snapshot(dir())));  // no output, no temporary folder left
    return r;
  }
};

TEST_F(BadPrepare, MissingInput) {
  const RunResult r = prepare({world().corpus(), dir("missing.txt")}, dir("out"));
  EXPECT_TRUE(fails_clearly(r, {dir("missing.txt"), "does not exist", "--input"}));
}

TEST_F(BadPrepare, EmptyFile) {
  write_file(dir("empty.txt"), "");
  const RunResult r = prepare({dir("empty.txt")}, dir("out"));
  EXPECT_TRUE(fails_clearly(r, {dir("empty.txt"), "no text"}));
}

TEST_F(BadPrepare, BlankFile) {
  write_file(dir("blank.txt"), "\n   \n\t\n");
  const RunResult r = prepare({dir("blank.txt")}, dir("out"));
  EXPECT_TRUE(fails_clearly(r, {dir("blank.txt"), "no text"}));
}

TEST_F(BadPrepare, EmptyFolder) {
  fs::create_directories(dir("texts"));
  const RunResult r = prepare({dir("texts")}, dir("out"));
  EXPECT_TRUE(fails_clearly(r, {dir("texts"), "no text"}));
}

TEST_F(BadPrepare, BinaryFile) {
  std::string elf =
      "\x7f"
      "ELF";
  elf += std::string("\x02\x01\x01\x00\x00\x00\x00\x00", 8);
  for (int i = 0; i < 300; ++i) elf += static_cast<char>((i * 37) & 0xff);
  write_file(dir("texts/a.txt"), "Some text.\n");
  write_file(dir("texts/program"), elf);
  const RunResult r = prepare({dir("texts")}, dir("out"));
  EXPECT_TRUE(fails_clearly(r, {dir("texts/program"), "not UTF-8", "byte"}));
}

// A bad JSONL line among good ones is skipped with a line naming the file, the line and the
// problem, and counted in meta.json: one broken record must not stop a prepare of gigabytes.
TEST_F(BadPrepare, BadJsonlLineIsSkippedAndNamed) {
  write_file(dir("docs.jsonl"), "{\"text\": \"one\"}\n{\"body\": \"two\"}\n{\"text\": \"three\"}\n");
  const RunResult r = run_atoll({"data", "prepare", "--input", dir("docs.jsonl"), "--out", dir("out"), "--vocab-size", "384"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.err.find(dir("docs.jsonl") + ":2: no string field \"text\"; line skipped"), std::string::npos) << r.err;
  const auto meta = nlohmann::json::parse(read_file(dir("out/meta.json")));
  EXPECT_EQ(meta["skipped"]["lines"]["no string field \"text\""], 1);
  EXPECT_EQ(meta["documents"], 2);
}

TEST_F(BadPrepare, OutputFolderHoldsOtherFiles) {
  write_file(dir("out/notes.txt"), "mine\n");
  const RunResult r = prepare({world().corpus()}, dir("out"));
  EXPECT_TRUE(fails_clearly(r, {dir("out"), "meta.json", "--out"}));
}

TEST_F(BadPrepare, OutputFolderHoldsAnotherDataset) {
  const RunResult first =
      run_atoll({"data", "prepare", "--input", world().corpus(), "--out", dir("out"), "--vocab-size", "320"});
  ASSERT_EQ(first.exit_code, 0) << first.describe();
  const RunResult r = prepare({world().corpus()}, dir("out"));  // vocabulary 384 this time
  EXPECT_TRUE(fails_clearly(r, {dir("out"), "requested_vocab_size", "--out"}));
}

// A vocabulary below what the tokenizer needs for the corpus: refused before training, naming
// the flag or key and the minimum, which then works.
TEST_F(BadPrepare, VocabularyBelowTheTokenizersMinimum) {
  const std::string corpus = world().corpus();
  const RunResult r = run_atoll({"data", "prepare", "--input", corpus, "--out", dir("out"), "--vocab-size", "64"});
  EXPECT_TRUE(fails_clearly(r, {"--vocab-size 64", corpus, "at least"}));
  EXPECT_FALSE(fs::exists(dir("out")));
  const std::string line = r.error_lines().empty() ? "" : r.error_lines()[0];
  const size_t at = line.find("at least ");
  ASSERT_NE(at, std::string::npos) << line;
  const int need = std::stoi(line.substr(at + 9));
  const RunResult below = run_atoll(
      {"data", "prepare", "--input", corpus, "--out", dir("out"), "--vocab-size", std::to_string(need - 1)});
  EXPECT_TRUE(fails_clearly(below, {"at least " + std::to_string(need)}));
  const RunResult ok =
      run_atoll({"data", "prepare", "--input", corpus, "--out", dir("out"), "--vocab-size", std::to_string(need)});
  EXPECT_EQ(ok.exit_code, 0) << ok.describe();

  // The same through `atoll train`: the key that set the vocabulary is named.
  const RunResult train = world().train(
      dir("run"), {"--set", "data.dir=\"" + dir("cache-data") + "\"", "--set", "data.vocab_size=2"});
  // (a size below 260 is already refused by the config check; the corpus minimum is tested above)
  EXPECT_TRUE(fails_clearly(train, {"data.vocab_size", "at least 260"}));
  const RunResult by_model = world().train(
      dir("run"), {"--set", "data.dir=\"" + dir("cache-data") + "\"", "--set", "model.vocab_size=100"});
  EXPECT_TRUE(fails_clearly(by_model, {"model.vocab_size = 100", "at least " + std::to_string(need)}));
  EXPECT_FALSE(fs::exists(dir("cache-data")));
  EXPECT_FALSE(fs::exists(dir("run")));
}

// ---------------------------------------------------------------------------------------------
// Token shards with a bad header or truncated; a tokenizer of another vocabulary.

class BadData : public CliTest {
 protected:
  // A copy of the prepared data, to damage.
  std::string data_copy() {
    base_run();  // prepares the data
    fs::copy(world().data_dir(), dir("data"), fs::copy_options::recursive);
    return dir("data");
  }
  // `atoll train` on `data_dir` into a new run folder; checks that nothing changed.
  RunResult train_on(const std::string& data_dir, const std::vector<std::string>& extra = {}) {
    const auto before = snapshot(dir());
    std::vector<std::string> args = {"--set", "data.dir=\"" + data_dir + "\""};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r = world().train(dir("run"), args);
    EXPECT_TRUE(unchanged(before, snapshot(dir())));
    EXPECT_FALSE(fs::exists(dir("run"))) << "a run directory was created for data that cannot be used";
    return r;
  }
};

TEST_F(BadData, TrainShardWithBadMagic) {
  const std::string data = data_copy();
  patch_file(data + "/train_000000.bin", 0, std::string("\x01\x02\x03\x04", 4));
  const RunResult r = train_on(data);
  EXPECT_TRUE(fails_clearly(r, {data + "/train_000000.bin", "magic"}));
}

TEST_F(BadData, TrainShardWithUnknownVersion) {
  const std::string data = data_copy();
  patch_file(data + "/train_000000.bin", 4, std::string("\x07\x00\x00\x00", 4));
  const RunResult r = train_on(data);
  EXPECT_TRUE(fails_clearly(r, {data + "/train_000000.bin", "version"}));
}

TEST_F(BadData, TruncatedTrainShard) {
  const std::string data = data_copy();
  truncate_by(data + "/train_000000.bin", 101);
  const RunResult r = train_on(data);
  EXPECT_TRUE(fails_clearly(r, {data + "/train_000000.bin", "truncated"}));
}

TEST_F(BadData, TrainShardShorterThanItsHeader) {
  const std::string data = data_copy();
  fs::resize_file(data + "/train_000000.bin", 100);
  const RunResult r = train_on(data);
  EXPECT_TRUE(fails_clearly(r, {data + "/train_000000.bin", "header", "truncated"}));
}

TEST_F(BadData, TruncatedValidationShard) {
  const std::string data = data_copy();
  truncate_by(data + "/val_000000.bin", 3);
  const RunResult r = train_on(data);
  EXPECT_TRUE(fails_clearly(r, {data + "/val_000000.bin", "truncated"}));
}

TEST_F(BadData, NoShardsInDataFolder) {
  write_file(dir("data/readme.txt"), "not shards\n");
  const RunResult r = train_on(dir("data"));
  EXPECT_TRUE(fails_clearly(r, {dir("data"), "train_*.bin"}));
}

TEST_F(BadData, TokenizerLargerThanModelVocabulary) {
  base_run();
  // The prepared data's tokenizer has 384 pieces (meta.json vocab_size); the model only 300.
  const auto data_before = snapshot(world().data_dir());
  const RunResult r = train_on(world().data_dir(), {"--set", "model.vocab_size=300"});
  EXPECT_TRUE(fails_clearly(r, {world().data_dir() + "/meta.json", "model.vocab_size", "384"}));
  EXPECT_TRUE(unchanged(data_before, snapshot(world().data_dir())));
}

TEST_F(BadData, LlmcShardWithTokensOutsideTheVocabulary) {
  // A folder of llm.c shards (no meta.json) whose ids exceed model.vocab_size.
  std::vector<uint16_t> tokens(400);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 7 % 383);
  tokens[123] = 1000;
  write_file(dir("llmc/train_000000.bin"), llmc_shard(tokens));
  write_file(dir("llmc/val_000000.bin"), llmc_shard(std::vector<uint16_t>(100, 5)));
  const auto before = snapshot(dir());
  const RunResult r = world().train(dir("run"), {"--set", "data.dir=\"" + dir("llmc") + "\""});
  EXPECT_TRUE(fails_clearly(r, {dir("llmc/train_000000.bin"), "1000", "model.vocab_size"}));
  for (const auto& [path, bytes] : before) EXPECT_EQ(read_file(dir(path)), bytes) << path;
}

TEST_F(BadData, EvalOnAShardOfAnotherVocabulary) {
  const std::string run = base_run();
  std::vector<uint16_t> tokens(200, 7);
  tokens[50] = 5000;
  write_file(dir("other.bin"), llmc_shard(tokens));
  const auto before = snapshot(run);
  const RunResult r = run_atoll({"eval", "--checkpoint", run, "--data", dir("other.bin")});
  EXPECT_TRUE(fails_clearly(r, {dir("other.bin"), "5000", "model.vocab_size"}));
  EXPECT_TRUE(unchanged(before, snapshot(run)));
}

TEST_F(BadData, EvalOnATextFile) {
  const std::string run = base_run();
  const RunResult r = run_atoll({"eval", "--checkpoint", run, "--data", world().corpus()});
  EXPECT_TRUE(fails_clearly(r, {world().corpus(), "magic"}));
}

TEST_F(BadData, EvalOnAMissingShard) {
  const RunResult r = run_atoll({"eval", "--checkpoint", base_run(), "--data", dir("nowhere.bin")});
  EXPECT_TRUE(fails_clearly(r, {dir("nowhere.bin"), "--data"}));
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: truncated, a flipped byte (checksum), another model shape; read by eval,
// generate, export and `train --resume`.

class BadCheckpoint : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    run_ = copy_of_base_run();
    ckpt_ = run_ + "/checkpoints/step-00000004";
    tensors_ = ckpt_ + "/rank-00000.safetensors";
  }
  // Byte offset of tensor `name` in the rank file (from the manifest).
  uint64_t offset_of(const std::string& name) const {
    const auto manifest = nlohmann::json::parse(read_file(ckpt_ + "/manifest.json"));
    return manifest.at("tensors").at(name).at("offset").get<uint64_t>();
  }
  // Runs `args`; checks that the run is unchanged and `out` (if given) was not created.
  RunResult run_checked(const std::vector<std::string>& args, const std::string& out = "") {
    const auto before = snapshot(run_);
    RunResult r = run_atoll(args);
    EXPECT_TRUE(unchanged(before, snapshot(run_)));
    if (!out.empty()) {
      EXPECT_FALSE(fs::exists(out)) << out << " was created";
    }
    return r;
  }
  std::string run_, ckpt_, tensors_;
};

TEST_F(BadCheckpoint, EvalTruncated) {
  truncate_by(tensors_, 1000);
  const RunResult r = run_checked({"eval", "--checkpoint", run_});
  EXPECT_TRUE(fails_clearly(r, {tensors_, "truncated"}));
}

TEST_F(BadCheckpoint, EvalFlippedByte) {
  flip_byte(tensors_, offset_of("param/layers.1.moe.w2") + 77);
  const RunResult r = run_checked({"eval", "--checkpoint", ckpt_});
  EXPECT_TRUE(fails_clearly(r, {tensors_, "param/layers.1.moe.w2", "checksum"}));
}

TEST_F(BadCheckpoint, EvalDamagedManifest) {
  patch_file(ckpt_ + "/manifest.json", 0, "[");
  const RunResult r = run_checked({"eval", "--checkpoint", ckpt_});
  EXPECT_TRUE(fails_clearly(r, {ckpt_}));
}

TEST_F(BadCheckpoint, GenerateFlippedByte) {
  flip_byte(tensors_, offset_of("param/embed") + 5);
  const RunResult r = run_checked({"generate", "--checkpoint", run_, "--prompt", "The sea"});
  EXPECT_TRUE(fails_clearly(r, {tensors_, "param/embed", "checksum"}));
}

TEST_F(BadCheckpoint, ExportTruncated) {
  truncate_by(tensors_, 1);
  const RunResult r = run_checked({"export", "--checkpoint", run_, "--format", "hf", "--out", dir("hf")}, dir("hf"));
  EXPECT_TRUE(fails_clearly(r, {tensors_, "truncated"}));
}

TEST_F(BadCheckpoint, ExportOverAPreviousExportKeepsIt) {
  const RunResult first = run_atoll({"export", "--checkpoint", base_run(), "--format", "hf", "--out", dir("hf")});
  ASSERT_EQ(first.exit_code, 0) << first.describe();
  const auto before = snapshot(dir("hf"));
  flip_byte(tensors_, offset_of("param/final_norm"));
  const RunResult r = run_checked({"export", "--checkpoint", run_, "--format", "hf", "--out", dir("hf")});
  EXPECT_TRUE(fails_clearly(r, {tensors_, "param/final_norm", "checksum"}));
  EXPECT_TRUE(unchanged(before, snapshot(dir("hf"))));
}

TEST_F(BadCheckpoint, ExportFlippedByte) {
  flip_byte(tensors_, offset_of("param/head") + 100);
  const RunResult r = run_checked({"export", "--checkpoint", run_, "--format", "hf", "--out", dir("hf")}, dir("hf"));
  EXPECT_TRUE(fails_clearly(r, {tensors_, "param/head", "checksum"}));
}

// A resume notices a damaged newest checkpoint, names what is damaged and continues from the one
// before it (tests/cli/damaged_checkpoint_test.cc has the rest of that contract).
TEST_F(BadCheckpoint, ResumeTruncated) {
  truncate_by(tensors_, 4096);
  const RunResult r = run_atoll(
      {"train", "--config", world().config(), "--run-dir", run_, "--resume", "--no-sample", "--set", "train.steps=6"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.err.find(tensors_ + ": file is"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
}

TEST_F(BadCheckpoint, ResumeFlippedByteInOptimizerState) {
  // eval does not read the optimizer moments; a resume does and must notice.
  flip_byte(tensors_, offset_of("adam_v/layers.0.attn.wq") + 3);
  const RunResult r = run_atoll(
      {"train", "--config", world().config(), "--run-dir", run_, "--resume", "--no-sample", "--set", "train.steps=6"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.err.find("adam_v/layers.0.attn.wq' fails its checksum"), std::string::npos) << r.err;
}

TEST_F(BadCheckpoint, ResumeFromACheckpointOfAnotherModel) {
  // A checkpoint of a wider model put in the run's place (config.toml still says dim = 32).
  const RunResult other = world().train(dir("wide"), {"--set", "model.dim=48", "--set", "train.steps=2"});
  ASSERT_EQ(other.exit_code, 0) << other.describe();
  fs::remove_all(ckpt_);
  fs::copy(dir("wide/checkpoints/step-00000002"), ckpt_, fs::copy_options::recursive);
  const RunResult r = run_checked(
      {"train", "--config", world().config(), "--run-dir", run_, "--resume", "--no-sample", "--set", "train.steps=6"});
  EXPECT_TRUE(fails_clearly(r, {ckpt_, "another model", "model.dim", "48", "32"}));
}

TEST_F(BadCheckpoint, NotACheckpoint) {
  fs::create_directories(dir("empty"));
  const RunResult r = run_checked({"eval", "--checkpoint", dir("empty")});
  EXPECT_TRUE(fails_clearly(r, {dir("empty"), "manifest.json"}));
}

// ---------------------------------------------------------------------------------------------
// Run and export folders that already hold something else.

class BadFolder : public CliTest {};

TEST_F(BadFolder, TrainIntoARunWithoutResume) {
  const std::string run = copy_of_base_run();
  const auto before = snapshot(run);
  const RunResult r = world().train(run);
  EXPECT_TRUE(fails_clearly(r, {run + "/config.toml", "--resume"}));
  EXPECT_TRUE(unchanged(before, snapshot(run)));
}

TEST_F(BadFolder, ResumeWithAnotherModelShape) {
  const std::string run = copy_of_base_run();
  const auto before = snapshot(run);
  const RunResult r = world().train(run, {"--resume", "--set", "model.n_experts=8"});
  EXPECT_TRUE(fails_clearly(r, {run + "/config.toml", "model.n_experts", "8", "4"}));
  EXPECT_TRUE(unchanged(before, snapshot(run)));
}

TEST_F(BadFolder, ResumeOnOtherData) {
  const RunResult prep =
      run_atoll({"data", "prepare", "--input", world().corpus(), "--out", dir("other"), "--vocab-size", "320"});
  ASSERT_EQ(prep.exit_code, 0) << prep.describe();
  const std::string run = copy_of_base_run();
  const auto before = snapshot(run);
  const std::vector<std::string> other = {"--resume", "--set", "data.dir=\"" + dir("other") + "\"", "--set",
                                          "train.steps=6"};
  // Other data is another run: refused by the key, unless asked for.
  EXPECT_TRUE(fails_clearly(world().train(run, other), {"data.dir", dir("other"), "--allow-config-change"}));
  EXPECT_TRUE(unchanged(before, snapshot(run)));
  // Asked for, the run's checkpoint holds a data cursor over the micro data; other data cannot
  // continue it, and the run is left as it was (checked before anything is written). (Another
  // model.seq_len over the same data re-chunks: docs/long_context.md.)
  auto allowed = other;
  allowed.push_back("--allow-config-change");
  EXPECT_TRUE(fails_clearly(world().train(run, allowed), {"another stream", "the same data and train.seed"}));
  EXPECT_TRUE(unchanged(before, snapshot(run)));
}

TEST_F(BadFolder, TrainIntoAFolderOfOtherFiles) {
  write_file(dir("run/notes.txt"), "mine\n");
  const auto before = snapshot(dir());
  const RunResult r = world().train(dir("run"));
  EXPECT_TRUE(fails_clearly(r, {dir("run"), "config.toml", "--run-dir"}));
  EXPECT_TRUE(unchanged(before, snapshot(dir())));
}

TEST_F(BadFolder, ExportIntoAFolderOfOtherFiles) {
  write_file(dir("hf/notes.txt"), "mine\n");
  write_file(dir("hf/config.json"), "{\"architectures\": [\"LlamaForCausalLM\"]}\n");
  const auto before = snapshot(dir());
  const auto run_before = snapshot(base_run());
  const RunResult r = run_atoll({"export", "--checkpoint", base_run(), "--format", "hf", "--out", dir("hf")});
  EXPECT_TRUE(fails_clearly(r, {dir("hf"), "--out"}));
  EXPECT_TRUE(unchanged(before, snapshot(dir())));
  EXPECT_TRUE(unchanged(run_before, snapshot(base_run())));
}

}  // namespace
}  // namespace atl::testing
