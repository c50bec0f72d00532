// Context extension with data.phases (docs/long_context.md): a phase that doubles model.seq_len
// and raises model.rope_theta continues the run; its first loss at the new length is what `atoll
// eval` gives the checkpoint taken at the boundary at that length; the change is a data_phase
// event and every metrics row carries the seq_len in force; a resume across the boundary is
// exact; islands under `atoll launch` change together; `--resume` at a longer model.seq_len is a
// logged change; bad phases are refused before anything is written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <string>

#include "atoll/data/shard.h"
#include "atoll/data/shard_writer.h"
#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using nlohmann::json;

constexpr int kT0 = MicroWorld::kSeqLen, kT1 = 2 * kT0, kBatch = 4;

class ContextPhase : public CliTest {
 protected:
  // A prepared dataset of exactly 2 x kBatch windows of kT0 tokens, so kBatch windows of kT1:
  // after 2 steps at kT0 the epoch ends, and the first step at kT1 reads every window of the
  // new length (in its shuffled order), the windows `atoll eval --data` reads in shard order.
  // Made from the world's tokens, with the world's tokenizer and a manifest of its own.
  std::string exact_dataset() {
    const std::string out = world().path("ctx-data");
    if (std::filesystem::exists(out + "/meta.json")) return out;
    base_run();  // prepares world().data_dir()
    const std::string from = world().data_dir();
    std::filesystem::create_directories(out);
    json meta = json::parse(read_file(from + "/meta.json"));
    auto cut = [&](const std::string& split, size_t n) {
      std::vector<int32_t> tokens = read_shard(from + "/" + split + "_000000.bin");
      EXPECT_GE(tokens.size(), n);
      tokens.resize(n);
      const std::string name = split + "_000000.bin";
      write_shard(out + "/" + name, tokens, shard_version_for_vocab(MicroWorld::kVocab));
      meta["manifest"][split] = json::array({ShardRecord{name, int64_t(n), shard_checksum(out + "/" + name)}});
      meta[split + "_shards"] = json::array({name});
      meta[split + "_tokens"] = n;
    };
    cut("train", size_t(2 * kBatch * kT0 + 1));
    cut("val", size_t(2 * kT1 + 1));
    std::filesystem::copy_file(from + "/tokenizer.model", out + "/tokenizer.model");
    write_file(out + "/meta.json", meta.dump(2));
    return out;
  }
  // `atoll train` on the micro config reading `data` in two phases: kT0 tokens a sequence for 2
  // steps, then kT1 with RoPE base 40000; a constant schedule, so that a shorter first run and
  // its resume compare with one run; plus `extra` arguments.
  RunResult train_phases(const std::string& run, const std::string& data, std::vector<std::string> extra = {}) {
    const std::string mix = "mix = [{dir = \"" + data + "\"}]";
    std::vector<std::string> args = {
        "--set", "data.input=[]", "--set", "data.dir=\"\"", "--set", "optim.schedule=\"constant\"", "--set",
        "data.phases=[{at_tokens = 0, " + mix + "}, {at_tokens = " + std::to_string(2 * kBatch * kT0) + ", " + mix +
            ", model.seq_len = " + std::to_string(kT1) + ", model.rope_theta = 40000.0}]"};
    args.insert(args.end(), extra.begin(), extra.end());
    return world().train(run, args);
  }
};

TEST_F(ContextPhase, DoublingSeqLenContinuesEqualsEvalAndResumesExactly) {
  const std::string data = exact_dataset(), run = dir("run");
  const RunResult r = train_phases(run, data);
  ASSERT_EQ(r.exit_code, 0) << r.describe();

  const std::vector<json> rows = read_jsonl(run + "/metrics.jsonl");
  ASSERT_EQ(rows.size(), 4u);
  for (const json& row : rows) EXPECT_EQ(row["seq_len"], row["step"].get<int>() <= 2 ? kT0 : kT1) << row;
  EXPECT_EQ(rows[3]["tokens"], 2 * kBatch * kT0 + 2 * kBatch * kT1);
  std::vector<json> phases;
  for (const json& e : read_jsonl(run + "/events.jsonl"))
    if (e["event"] == "data_phase") phases.push_back(e);
  ASSERT_EQ(phases.size(), 2u);
  const json& change = phases[1];
  EXPECT_EQ(change["phase"], 1);
  EXPECT_EQ(change["step"], 2);
  EXPECT_EQ(change["seq_len"], kT1);
  EXPECT_EQ(change["rope_theta"], 40000.0);
  ASSERT_EQ(change["changes"].size(), 2u) << change;
  EXPECT_EQ(change["changes"][0], (json{{"key", "model.seq_len"}, {"was", kT0}, {"now", kT1}}));
  EXPECT_EQ(change["changes"][1]["key"], "model.rope_theta");
  EXPECT_EQ(change["changes"][1]["now"], 40000.0);

  // The checkpoint at the boundary (step 2) evaluated at the phase's length and RoPE base (eval
  // reads them from data.phases at the checkpoint's tokens) over the same kBatch windows the
  // first step at kT1 trained on: the same mean loss, up to the order of the sums (1e-6).
  const RunResult e = run_atoll({"eval", "--checkpoint", run + "/checkpoints/step-00000002", "--data",
                                 data + "/train_000000.bin", "--batch", std::to_string(kBatch)});
  ASSERT_EQ(e.exit_code, 0) << e.describe();
  const json eval = json::parse(e.out);
  EXPECT_EQ(eval["tokens"], kBatch * kT1) << eval;
  const double first_long = rows[2]["loss"].get<double>();
  EXPECT_NEAR(eval["loss"].get<double>(), first_long, 1e-6 * std::abs(first_long)) << eval;
  std::printf("first loss at seq_len %d: train %.17g, eval %.17g, relative difference %.3g\n", kT1, first_long,
              eval["loss"].get<double>(), std::abs(eval["loss"].get<double>() - first_long) / std::abs(first_long));

  // The same run stopped at the boundary and resumed: the same rows, bit for bit.
  const std::string split = dir("split");
  const RunResult first = train_phases(split, data, {"--set", "train.steps=2"});
  ASSERT_EQ(first.exit_code, 0) << first.describe();
  const RunResult resumed = train_phases(split, data, {"--set", "train.steps=4", "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.describe();
  const std::vector<json> again = read_jsonl(split + "/metrics.jsonl");
  ASSERT_EQ(again.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(again[i]["loss"], rows[i]["loss"]) << i;
    EXPECT_EQ(again[i]["seq_len"], rows[i]["seq_len"]) << i;
    EXPECT_EQ(again[i]["grad_norm"], rows[i]["grad_norm"]) << i;
  }
}

// Islands under `atoll launch` change at the same step (their token counts agree), so their
// outer steps still agree: the same theta_hash on every island after the change.
TEST_F(ContextPhase, IslandsChangeTogether) {
  base_run();  // prepares world().data_dir()
  const std::string run = dir("run"), mix = "mix = [{dir = \"" + world().data_dir() + "\"}]";
  // 2 islands x 4 sequences of kT0: 256 tokens a step, so the phase starts with step 2.
  const RunResult r = run_atoll(
      {"launch", "--config", world().config(), "--run-dir", run, "--islands", "2", "--set", "data.input=[]", "--set",
       "data.dir=\"\"", "--set", "diloco.inner_steps=2", "--set", "train.eval_every=0", "--set",
       "data.phases=[{at_tokens = 0, " + mix + "}, {at_tokens = 256, " + mix + ", model.seq_len = 64, model.rope_theta = "
       "40000.0}]"},
      120);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  std::map<int64_t, std::set<std::string>> hashes;  // step -> the islands' theta_hash
  int rows = 0;
  for (const json& row : read_jsonl(run + "/metrics.jsonl")) {
    ++rows;
    EXPECT_EQ(row["seq_len"], row["step"].get<int>() == 1 ? kT0 : 64) << row;
    if (row.contains("theta_hash")) hashes[row["step"].get<int64_t>()].insert(row["theta_hash"].get<std::string>());
  }
  EXPECT_EQ(rows, 2 * 4);
  ASSERT_EQ(hashes.size(), 2u);  // outer steps after steps 2 and 4
  for (const auto& [step, h] : hashes) EXPECT_EQ(h.size(), 1u) << "islands disagree after step " << step;
  int changes = 0;
  for (const json& e : read_jsonl(run + "/events.jsonl"))
    if (e["event"] == "data_phase" && e["phase"] == 1) {
      ++changes;
      EXPECT_EQ(e["step"], 1) << e;
      EXPECT_EQ(e["seq_len"], 64) << e;
    }
  EXPECT_GE(changes, 1);
}

TEST_F(ContextPhase, ResumeAtALongerSeqLenIsALoggedChange) {
  const std::string run = dir("run");
  const RunResult first = world().train(run, {"--set", "train.steps=2"});
  ASSERT_EQ(first.exit_code, 0) << first.describe();
  const RunResult longer = world().train(run, {"--resume", "--set", "train.steps=3", "--set", "model.seq_len=64",
                                               "--set", "model.rope_theta=40000.0"});
  ASSERT_EQ(longer.exit_code, 0) << longer.describe();
  const std::vector<json> rows = read_jsonl(run + "/metrics.jsonl");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1]["seq_len"], kT0);
  EXPECT_EQ(rows[2]["seq_len"], 64);
  json resume;
  for (const json& e : read_jsonl(run + "/events.jsonl"))
    if (e["event"] == "resume") resume = e;
  ASSERT_TRUE(resume.contains("config_changes")) << resume;
  const std::string changes = resume["config_changes"].dump();
  EXPECT_NE(changes.find("model.seq_len: 32 -> 64"), std::string::npos) << changes;
  EXPECT_NE(changes.find("model.rope_theta"), std::string::npos) << changes;
}

TEST_F(ContextPhase, BadPhasesFailClearlyAndWriteNothing) {
  const std::string data = exact_dataset();
  const auto before = snapshot(world().root());
  const std::string run = dir("run");
  auto with = [&](const std::string& phases, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--set", "data.input=[]", "--set", "data.dir=\"\"", "--set", "data.phases=" + phases};
    args.insert(args.end(), extra.begin(), extra.end());
    return world().train(run, args);
  };
  const std::string mix = "mix = [{dir = \"" + data + "\"}]";
  // A phase that shrinks the context.
  EXPECT_TRUE(fails_clearly(with("[{at_tokens = 0, " + mix + ", model.seq_len = 64}, {at_tokens = 256, " + mix + "}]"),
                            {"data.phases[1]", "model.seq_len = 32", "shorter than the 64 of data.phases[0]"}));
  // A key a phase may not set: the allowed ones named.
  EXPECT_TRUE(fails_clearly(with("[{at_tokens = 0, " + mix + "}, {at_tokens = 256, " + mix + ", model.dim = 64}]"),
                            {"data.phases[1].model.dim", "model.seq_len, model.rope_theta and train.batch_size"}));
  // A length not valid for the model: shorter than CCA's convolution window.
  EXPECT_TRUE(fails_clearly(with("[{at_tokens = 0, " + mix + ", model.seq_len = 2}, {at_tokens = 256, " + mix + "}]",
                                 {"--set", "model.attention=\"cca\""}),
                            {"data.phases[0]", "model.seq_len = 2", "convolution window"}));
  // A length the data cannot fill: 257 training tokens hold no window of 4097.
  EXPECT_TRUE(fails_clearly(with("[{at_tokens = 0, " + mix + "}, {at_tokens = 256, " + mix + ", model.seq_len = 4096}]"),
                            {"data.phases[1].model.seq_len = 4096", data, "no"}));
  EXPECT_TRUE(unchanged(before, snapshot(world().root())));
  EXPECT_FALSE(std::filesystem::exists(run));
}

}  // namespace
}  // namespace atl::testing
