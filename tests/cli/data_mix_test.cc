// `atoll train` with data.mix and data.phases as a user runs it: a mixture of two prepared
// datasets with a phase change trains to the end and logs data_phase; bad mixtures exit non-zero
// with one error line naming the key and the fix, and change nothing.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using nlohmann::json;

class DataMix : public CliTest {
 protected:
  // The world's dataset, and a second one from other text with the same tokenizer.
  std::string second_dataset() {
    base_run();  // prepares world().data_dir()
    const std::string out = world().path("data2");
    if (!std::filesystem::exists(out + "/meta.json")) {
      std::string text;
      for (const auto& d : make_docs(800, 99)) text += d + "\n";
      write_file(world().path("corpus2.txt"), text);
      const RunResult r = run_atoll({"data", "prepare", "--input", world().path("corpus2.txt"), "--out", out,
                                     "--tokenizer", world().data_dir() + "/tokenizer.model"});
      EXPECT_EQ(r.exit_code, 0) << r.describe();
    }
    return out;
  }
  // `atoll train` on the micro config without its data.input and data.dir, plus `sets`.
  RunResult train_with(const std::string& run, const std::vector<std::string>& sets) {
    std::vector<std::string> extra = {"--set", "data.input=[]", "--set", "data.dir=\"\""};
    for (const std::string& s : sets) extra.insert(extra.end(), {"--set", s});
    return world().train(run, extra);
  }
};

TEST_F(DataMix, PhasesOfAMixtureTrainAndAreLogged) {
  const std::string a = world().data_dir(), b = second_dataset(), run = dir("run");
  // 4 steps of 4 x 32 tokens: phase 1 starts with step 3 (256 tokens done).
  const RunResult r = train_with(run, {"data.phases=[{at_tokens = 0, mix = [{dir = \"" + a +
                                       "\"}]}, {at_tokens = 256, mix = [{dir = \"" + a + "\", weight = 1}, {dir = \"" +
                                       b + "\", weight = 3}]}]"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  std::vector<json> phases;
  for (const json& e : read_jsonl(run + "/events.jsonl"))
    if (e["event"] == "data_phase") phases.push_back(e);
  ASSERT_EQ(phases.size(), 2u);
  EXPECT_EQ(phases[1]["phase"], 1);
  EXPECT_EQ(phases[1]["step"], 2);
  EXPECT_EQ(phases[1]["tokens"], 256);
  const auto rows = read_jsonl(run + "/metrics.jsonl");
  ASSERT_EQ(rows.back()["step"], 4);
  EXPECT_EQ(rows.back()["val_losses"].size(), 2u) << rows.back();

  // `atoll eval` without --data reads the phase the checkpoint was in: both datasets, each
  // loss as --data gives it, their mean by the phase's weights (1 and 3).
  auto eval = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"eval", "--checkpoint", run, "--tokens", "256"};
    args.insert(args.end(), extra.begin(), extra.end());
    const RunResult e = run_atoll(args);
    EXPECT_EQ(e.exit_code, 0) << e.describe();
    return json::parse(e.out);
  };
  const json mixed = eval({}), only_a = eval({"--data", a}), only_b = eval({"--data", b});
  ASSERT_EQ(mixed["losses"].size(), 2u) << mixed;
  EXPECT_EQ(mixed["data"], "mixture");
  EXPECT_DOUBLE_EQ(mixed["losses"][a].get<double>(), only_a["loss"].get<double>());
  EXPECT_DOUBLE_EQ(mixed["losses"][b].get<double>(), only_b["loss"].get<double>());
  EXPECT_NEAR(mixed["loss"].get<double>(), (only_a["loss"].get<double>() + 3 * only_b["loss"].get<double>()) / 4, 1e-12);
  EXPECT_EQ(mixed["tokens"], 512);
}

TEST_F(DataMix, BadMixturesFailClearlyAndChangeNothing) {
  base_run();  // prepares world().data_dir()
  const std::string a = world().data_dir();
  write_file(dir("plain/notes.txt"), "not prepared\n");
  const auto before = snapshot(world().root());
  const std::string run = dir("run");
  EXPECT_TRUE(fails_clearly(train_with(run, {"data.mix=[{dir = \"" + a + "\", weight = 0}]"}),
                            {"data.mix[0].weight", "> 0"}));
  EXPECT_TRUE(fails_clearly(world().train(run, {"--set", "data.mix=[{dir = \"" + a + "\"}]"}),
                            {"data.mix is set together with data.dir"}));
  EXPECT_TRUE(fails_clearly(train_with(run, {"data.mix=[{dir = \"" + a + "\", weight = 1}, {dir = \"" + dir("plain") + "\", weight = 1}]"}),
                            {"data.mix[1].dir", dir("plain"), "meta.json", "atoll data prepare"}));
  EXPECT_TRUE(fails_clearly(train_with(run, {"data.mix=[{dir = \"" + a + "\", weight = 1}, {dir = \"" + a + "/\"}]"}),
                            {"data.mix[1].weight", "no weight given"}));
  EXPECT_TRUE(unchanged(before, snapshot(world().root())));
  EXPECT_FALSE(std::filesystem::exists(run));
}

}  // namespace
}  // namespace atl::testing
