// `atoll eval`: the mean next-token loss of a checkpoint on token shards (DESIGN.md "Command line").
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "atoll/cli/checkpoint_model.h"
#include "atoll/cli/commands.h"
#include "atoll/core/errors.h"
#include "atoll/data/loader.h"
#include "atoll/model/model.h"
#include "atoll/train/dataset.h"
#include "atoll/train/trainer.h"

namespace atl::cli {
Runner add_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "mean next-token loss of a checkpoint on a shard; prints one JSON object");
  struct Flags {
    std::string checkpoint, data;
    int64_t tokens = 0;
    int batch = 8;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("--checkpoint", f->checkpoint, "checkpoint or run directory")->required();
  cmd->add_option("--data", f->data, "a .bin shard, or a folder (its val_*.bin); default: the run's validation split");
  cmd->add_option("--tokens", f->tokens, "evaluate at most this many predicted tokens (0 = the whole shard)");
  cmd->add_option("--batch", f->batch, "sequences per forward pass")->check(CLI::PositiveNumber);
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    configure_threads(0);
    CheckpointModel cm = load_checkpoint_model(f->checkpoint);
    const std::string data = f->data.empty() ? resolve_dataset(cm.config).dir : f->data;
    const int T = cm.config.model.seq_len;
    DataLoader loader(data, "val", {.seq_len = T, .shuffle = false, .prefetch = false});
    loader.check_vocab(cm.config.model.vocab_size);
    int64_t windows = loader.n_windows();
    if (f->tokens > 0) windows = std::min<int64_t>(windows, (f->tokens + T - 1) / T);
    Model<float> model(cm.config.model, f->batch);
    model.params() = cm.params;
    std::vector<int32_t> in(size_t(f->batch) * T), tg(size_t(f->batch) * T);
    double sum = 0;
    for (int64_t done = 0; done < windows;) {
      const int b = int(std::min<int64_t>(f->batch, windows - done));
      loader.next_batch(b, in.data(), tg.data());
      sum += model.forward(in.data(), tg.data(), b).ce * b * T;
      done += b;
    }
    const double n = double(windows) * T, loss = sum / n;
    nlohmann::json out = {{"loss", loss}, {"perplexity", std::exp(loss)}, {"tokens", int64_t(n)},
                          {"checkpoint", cm.dir}, {"data", data}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  };
}

}  // namespace atl::cli
