#include "atoll/train/loop.h"

#include <algorithm>
#include <filesystem>

namespace atl {
namespace fs = std::filesystem;

int micro_batch(const TrainConfig& t) { return t.micro_batch_size ? t.micro_batch_size : t.batch_size; }

double evaluate(Model<float>& model, DataLoader& val, const Config& cfg) {
  const int mb = micro_batch(cfg.train), T = cfg.model.seq_len;
  const int64_t windows = std::min<int64_t>(int64_t(cfg.train.eval_batches) * mb, val.n_windows());
  std::vector<int32_t> in(size_t(mb) * T), tg(size_t(mb) * T);
  val.reset();
  double sum = 0;
  for (int64_t done = 0; done < windows;) {
    const int b = int(std::min<int64_t>(mb, windows - done));
    val.next_batch(b, in.data(), tg.data());
    sum += model.forward(in.data(), tg.data(), b).ce * b;
    done += b;
  }
  return sum / double(windows);
}

namespace {

bool has_val_split(const std::string& dir) {
  if (!fs::is_directory(dir)) return true;  // a single .bin file serves both
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("val_", 0) == 0 && e.path().extension() == ".bin") return true;
  return false;
}

}  // namespace

Loop::Loop(const Config& c, const std::string& data_dir, int worker, int n_workers)
    : cfg(c),
      model(c.model, micro_batch(c.train), parse_precision(c.train.precision)),
      opt(c.optim, model.layout()),
      train_data(data_dir, "train",
                 {.seq_len = c.model.seq_len, .seed = uint64_t(c.train.seed), .worker = worker, .n_workers = n_workers}),
      in(size_t(micro_batch(c.train)) * c.model.seq_len),
      tg(size_t(micro_batch(c.train)) * c.model.seq_len) {
  train_data.check_vocab(c.model.vocab_size);
  opt.set_muon_bf16(model.precision() == Precision::kBf16);
  if (has_val_split(data_dir)) {
    val_data = std::make_unique<DataLoader>(data_dir, "val",
                                            LoaderOptions{.seq_len = c.model.seq_len, .shuffle = false, .prefetch = false});
    val_data->check_vocab(c.model.vocab_size);
  }
}

LossParts Loop::gradients(int batch) {
  const int mb = micro_batch(cfg.train);
  const int n_micro = batch / mb;
  model.zero_grads();
  LossParts loss;
  for (int i = 0; i < n_micro; ++i) {
    train_data.next_batch(mb, in.data(), tg.data());
    LossParts part = model.forward_backward(in.data(), tg.data(), mb, 1.0 / n_micro);
    loss.ce += part.ce / n_micro, loss.aux += part.aux / n_micro, loss.z += part.z / n_micro;
  }
  return loss;
}

std::vector<CheckpointBuffer> Loop::buffers() {
  return {{"param", model.params().data()}, {"adam_m", opt.m().data()}, {"adam_v", opt.v().data()}};
}

nlohmann::json Loop::state() const {
  return {{"step", step}, {"tokens", tokens}, {"optimizer_step", opt.step_count()}, {"loader", train_data.cursor()}};
}

void Loop::restore(const nlohmann::json& s) {
  step = s.at("step").get<int64_t>();
  tokens = s.at("tokens").get<int64_t>();
  opt.set_step_count(s.at("optimizer_step").get<int64_t>());
  train_data.set_cursor(s.at("loader").get<Cursor>());
}

}  // namespace atl
