#include "atoll/train/loop.h"

#include <algorithm>
#include <filesystem>

namespace atl {
namespace fs = std::filesystem;

namespace {

bool has_val_split(const std::string& dir) {
  if (!fs::is_directory(dir)) return true;  // a single .bin file serves both
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("val_", 0) == 0 && e.path().extension() == ".bin") return true;
  return false;
}

}  // namespace

Loop::Loop(const Config& c, const std::string& data_dir, const LoopOptions& opts)
    : cfg(c),
      train_data(data_dir, "train",
                 {.seq_len = c.model.seq_len, .seed = uint64_t(c.train.seed), .worker = opts.worker,
                  .n_workers = opts.n_workers}),
      in(size_t(micro_batch(c.train)) * c.model.seq_len),
      tg(size_t(micro_batch(c.train)) * c.model.seq_len) {
  train_data.check_vocab(c.model.vocab_size);
  if (has_val_split(data_dir)) {
    val_data = std::make_unique<DataLoader>(data_dir, "val",
                                            LoaderOptions{.seq_len = c.model.seq_len, .shuffle = false, .prefetch = false});
    val_data->check_vocab(c.model.vocab_size);
  }
  engine = make_engine(c, {.device_index = opts.device_index, .island_rank = opts.island_rank,
                           .island_size = opts.island_size});
}

LossParts Loop::gradients(int batch) {
  const int mb = micro_batch(cfg.train);
  const int n_micro = batch / mb;
  engine->zero_grads();
  LossParts loss;
  for (int i = 0; i < n_micro; ++i) {
    train_data.next_batch(mb, in.data(), tg.data());
    LossParts part = engine->forward_backward(in.data(), tg.data(), mb, 1.0 / n_micro);
    loss.ce += part.ce / n_micro, loss.aux += part.aux / n_micro, loss.z += part.z / n_micro;
  }
  return loss;
}

double Loop::validate() {
  const int mb = micro_batch(cfg.train), T = cfg.model.seq_len;
  const int64_t windows = std::min<int64_t>(int64_t(cfg.train.eval_batches) * mb, val_data->n_windows());
  std::vector<int32_t> x(size_t(mb) * T), y(size_t(mb) * T);
  val_data->reset();
  double sum = 0;
  for (int64_t done = 0; done < windows;) {
    const int b = int(std::min<int64_t>(mb, windows - done));
    val_data->next_batch(b, x.data(), y.data());
    sum += engine->forward(x.data(), y.data(), b).ce * b;
    done += b;
  }
  return sum / double(windows);
}

}  // namespace atl
