// A model's loss on data made with another tokenizer means nothing (a foreign dataset once gave
// a lower, plausible loss). `data prepare` keeps the tokenizer's fingerprint (FNV-1a 64 of
// tokenizer.model's bytes) in meta.json, every checkpoint keeps the fingerprint of the data it
// trained on in its manifest, and `eval` (and `generate --tokenizer`) refuse a mismatch, naming
// both fingerprints and where they come from. Data or checkpoints from before fingerprints:
// their tokenizer.model stands in; without one, a single warning, no refusal.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "atoll/data/corpus.h"
#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using nlohmann::json;

std::string hex16(uint64_t h) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(h));
  return s;
}

// The fingerprint of a tokenizer file, computed here from its bytes.
std::string fingerprint_of(const std::string& model_path) { return hex16(fnv1a64(read_file(model_path))); }

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

class TokenizerFingerprint : public CliTest {
 protected:
  std::string checkpoint() const { return base_run() + "/checkpoints/step-00000004"; }
  // Data prepared from the micro corpus with another vocabulary: another tokenizer.
  std::string other_data() {
    const RunResult r =
        run_atoll({"data", "prepare", "--input", world().corpus(), "--out", dir("other"), "--vocab-size", "320"});
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    return dir("other");
  }
};

TEST_F(TokenizerFingerprint, PrepareAndCheckpointsRecordIt) {
  const std::string run = base_run();
  const json meta = json::parse(read_file(world().data_dir() + "/meta.json"));
  const std::string fp = fingerprint_of(world().data_dir() + "/tokenizer.model");
  EXPECT_EQ(meta.value("tokenizer_fingerprint", ""), fp);
  for (const char* step : {"step-00000002", "step-00000004"}) {
    const json manifest = json::parse(read_file(run + "/checkpoints/" + step + "/manifest.json"));
    EXPECT_EQ(manifest["state"].value("tokenizer_fingerprint", ""), fp) << step;
  }
  EXPECT_EQ(fingerprint_of(run + "/tokenizer.model"), fp);
}

TEST_F(TokenizerFingerprint, EvalRefusesDataOfAnotherTokenizer) {
  const std::string other = other_data();
  const std::string theirs = json::parse(read_file(other + "/meta.json")).value("tokenizer_fingerprint", "?");
  const std::string ours = fingerprint_of(base_run() + "/tokenizer.model");
  ASSERT_NE(theirs, ours);
  for (const std::string& data : {other, other + "/val_000000.bin"}) {
    const RunResult r = run_atoll({"eval", "--checkpoint", base_run(), "--data", data});
    EXPECT_TRUE(fails_clearly(r, {other + "/meta.json", theirs, checkpoint() + "/manifest.json", ours, "--data"}));
    EXPECT_EQ(r.out, "") << "printed a loss";
  }
}

TEST_F(TokenizerFingerprint, EvalOnTheRunsOwnDataNeedsNoWarning) {
  for (const std::vector<std::string>& extra : {std::vector<std::string>{}, {"--data", world().data_dir()}}) {
    std::vector<std::string> args = {"eval", "--checkpoint", base_run()};
    args.insert(args.end(), extra.begin(), extra.end());
    const RunResult r = run_atoll(args);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(count(r.err, "fingerprint"), 0) << r.err;
  }
}

// Data from before fingerprints: its tokenizer.model stands in for meta.json's field; without
// it (shards made elsewhere) eval warns once and evaluates.
TEST_F(TokenizerFingerprint, OldDataIsCheckedByItsTokenizerOrWarnedAbout) {
  base_run();
  fs::copy(world().data_dir(), dir("old"), fs::copy_options::recursive);
  json meta = json::parse(read_file(dir("old/meta.json")));
  meta.erase("tokenizer_fingerprint");
  write_file(dir("old/meta.json"), meta.dump(2));
  const RunResult same = run_atoll({"eval", "--checkpoint", base_run(), "--data", dir("old")});
  ASSERT_EQ(same.exit_code, 0) << same.describe();
  EXPECT_EQ(count(same.err, "fingerprint"), 0) << same.err;

  const std::string other = other_data();
  fs::remove(other + "/meta.json");
  const RunResult refused = run_atoll({"eval", "--checkpoint", base_run(), "--data", other});
  EXPECT_TRUE(fails_clearly(refused, {other + "/tokenizer.model", fingerprint_of(other + "/tokenizer.model")}));

  fs::remove(dir("old/tokenizer.model"));
  const RunResult unknown = run_atoll({"eval", "--checkpoint", base_run(), "--data", dir("old")});
  ASSERT_EQ(unknown.exit_code, 0) << unknown.describe();
  EXPECT_EQ(count(unknown.err, "fingerprint"), 1) << unknown.err;
  EXPECT_EQ(count(unknown.err, dir("old")), 1) << unknown.err;
}

// A checkpoint from before fingerprints: the run's tokenizer.model stands in; without it, a
// warning.
TEST_F(TokenizerFingerprint, OldCheckpointsAreCheckedByTheRunsTokenizerOrWarnedAbout) {
  const std::string run = copy_of_base_run();
  const std::string ck = run + "/checkpoints/step-00000004";
  json manifest = json::parse(read_file(ck + "/manifest.json"));
  manifest["state"].erase("tokenizer_fingerprint");
  write_file(ck + "/manifest.json", manifest.dump());
  const std::string other = other_data();
  const RunResult refused = run_atoll({"eval", "--checkpoint", ck, "--data", other});
  EXPECT_TRUE(fails_clearly(refused, {run + "/tokenizer.model", other + "/meta.json"}));

  fs::remove(run + "/tokenizer.model");
  const RunResult unknown = run_atoll({"eval", "--checkpoint", ck, "--data", other});
  ASSERT_EQ(unknown.exit_code, 0) << unknown.describe();
  EXPECT_EQ(count(unknown.err, "fingerprint"), 1) << unknown.err;
}

TEST_F(TokenizerFingerprint, GenerateRefusesAnotherTokenizer) {
  const std::string other = other_data();
  const RunResult r = run_atoll(
      {"generate", "--checkpoint", base_run(), "--prompt", "The sea", "--tokenizer", other + "/tokenizer.model"});
  EXPECT_TRUE(fails_clearly(r, {other + "/tokenizer.model", fingerprint_of(other + "/tokenizer.model"),
                                checkpoint() + "/manifest.json", "--tokenizer"}));
}

}  // namespace
}  // namespace atl::testing
