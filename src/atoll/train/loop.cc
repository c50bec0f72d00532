#include "atoll/train/loop.h"

#include <algorithm>
#include <filesystem>

#include "atoll/atoll_config.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/dist/group.h"
#include "atoll/optim/clip.h"
#if ATOLL_WITH_CUDA
#include "atoll/backend/cuda/device.h"
#include "atoll/backend/cuda/nccl.h"
#include "atoll/model/device_model.h"
#include "atoll/optim/device_optimizer.h"
#endif

namespace atl {
namespace fs = std::filesystem;

int micro_batch(const TrainConfig& t) { return t.micro_batch_size ? t.micro_batch_size : t.batch_size; }

bool wants_gpu(const TrainConfig& t) {
  if (t.device != "cuda") return false;
#if ATOLL_WITH_CUDA
  return true;
#else
  throw ConfigError(
      "train.device = \"cuda\" needs a CUDA build of atoll, and this one has none; fix: build with "
      "-DATOLL_WITH_CUDA=ON (scripts/build_gpu.sh builds build-cuda), or set train.device = \"cpu\"");
#endif
}

void check_island_device(const TrainConfig& t, int workers_per_island) {
  if (!wants_gpu(t) || workers_per_island <= 1) return;
#if ATOLL_WITH_CUDA
  if (!gpu::nccl_available())
    throw ConfigError("train.device = \"cuda\" with --workers-per-island " + std::to_string(workers_per_island) +
                      " averages gradients with NCCL, and this build has none (no nccl.h and libnccl beside the "
                      "CUDA toolkit when build-cuda was configured); fix: install NCCL and reconfigure, or use "
                      "--workers-per-island 1, or set train.device = \"cpu\"");
#endif
}

#if ATOLL_WITH_CUDA
std::string gpu_in_use() {
  try {
    return gpu::describe_device();
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (train.device = \"cuda\"); fix: run where a GPU is visible, or set "
                "train.device = \"cpu\"");
  }
}

// Makes GPU `index` (modulo the count) current unless it is -1, and describes the GPU in use.
static std::string use_gpu(int index) {
  if (index >= 0) {
    gpu_in_use();  // no device: the runtime's reason and the fix, before select_device's bare error
    gpu::select_device(index);
  }
  return gpu_in_use();
}

struct DeviceLoop {
  // The device first, so that a machine without one fails with the runtime's reason and the fix.
  DeviceLoop(const Config& c, int device_index)
      : name(use_gpu(device_index)),
        model(c.model, micro_batch(c.train), {.precision = parse_precision(c.train.precision)}),
        opt(c.optim, model.layout()) {}

  std::string name;
  gpu::DeviceModel model;
  gpu::DeviceOptimizer opt;
  std::unique_ptr<gpu::NcclComm> nccl;  // the island's, with several workers per island
};
#else
struct DeviceLoop {};  // never made: wants_gpu() refuses cuda in this build
#endif

namespace {

// Mean cross-entropy over the first eval_batches micro-batches of `val`, with forward(in,
// targets, B) giving one micro-batch's loss.
template <typename Forward>
double evaluate_with(Forward&& forward, DataLoader& val, const Config& cfg) {
  const int mb = micro_batch(cfg.train), T = cfg.model.seq_len;
  const int64_t windows = std::min<int64_t>(int64_t(cfg.train.eval_batches) * mb, val.n_windows());
  std::vector<int32_t> in(size_t(mb) * T), tg(size_t(mb) * T);
  val.reset();
  double sum = 0;
  for (int64_t done = 0; done < windows;) {
    const int b = int(std::min<int64_t>(mb, windows - done));
    val.next_batch(b, in.data(), tg.data());
    sum += forward(in.data(), tg.data(), b).ce * b;
    done += b;
  }
  return sum / double(windows);
}

}  // namespace

double evaluate(Model<float>& model, DataLoader& val, const Config& cfg) {
  return evaluate_with([&](const int32_t* in, const int32_t* tg, int b) { return model.forward(in, tg, b); }, val,
                       cfg);
}

namespace {

bool has_val_split(const std::string& dir) {
  if (!fs::is_directory(dir)) return true;  // a single .bin file serves both
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("val_", 0) == 0 && e.path().extension() == ".bin") return true;
  return false;
}

}  // namespace

Loop::Loop(const Config& c, const std::string& data_dir, int worker, int n_workers, int device_index)
    : cfg(c),
      // On the GPU the host model only holds parameters: activations for one sequence suffice.
      model(c.model, wants_gpu(c.train) ? 1 : micro_batch(c.train), parse_precision(c.train.precision)),
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
#if ATOLL_WITH_CUDA
  if (wants_gpu(c.train)) device = std::make_unique<DeviceLoop>(c, device_index);
#else
  (void)device_index;
#endif
}

Loop::~Loop() = default;

LossParts Loop::gradients(int batch) {
  const int mb = micro_batch(cfg.train);
  const int n_micro = batch / mb;
  auto forward_backward = [&](double scale) {
#if ATOLL_WITH_CUDA
    if (device) return device->model.forward_backward(in.data(), tg.data(), mb, scale);
#endif
    return model.forward_backward(in.data(), tg.data(), mb, scale);
  };
#if ATOLL_WITH_CUDA
  if (device) device->model.zero_grads();
#endif
  if (!device) model.zero_grads();
  LossParts loss;
  for (int i = 0; i < n_micro; ++i) {
    train_data.next_batch(mb, in.data(), tg.data());
    LossParts part = forward_backward(1.0 / n_micro);
    loss.ce += part.ce / n_micro, loss.aux += part.aux / n_micro, loss.z += part.z / n_micro;
  }
  return loss;
}

double Loop::clip_grads() {
#if ATOLL_WITH_CUDA
  if (device) return device->opt.clip_grad_norm(device->model.grads(), cfg.optim.grad_clip);
#endif
  return clip_grad_norm(model.grads().data(), model.grads().size(), cfg.optim.grad_clip);
}

void Loop::optimizer_step(double lr) {
#if ATOLL_WITH_CUDA
  if (device) return device->opt.step(device->model.params(), device->model.grads(), lr);
#endif
  opt.step(model.params().data(), model.grads().data(), lr);
}

double Loop::validate() {
#if ATOLL_WITH_CUDA
  if (device)
    return evaluate_with(
        [&](const int32_t* x, const int32_t* y, int b) { return device->model.forward(x, y, b); }, *val_data, cfg);
#endif
  return evaluate(model, *val_data, cfg);
}

void Loop::to_device() {
#if ATOLL_WITH_CUDA
  if (!device) return;
  device->model.upload_params(model.params().data());
  device->opt.upload_state(opt.m().data(), opt.v().data());
  device->opt.set_step_count(opt.step_count());
#endif
}

void Loop::to_host() {
#if ATOLL_WITH_CUDA
  if (!device) return;
  device->model.download_params(model.params().data());
  device->opt.download_state(opt.m().data(), opt.v().data());
  opt.set_step_count(device->opt.step_count());
#endif
}

void Loop::params_to_host() {
#if ATOLL_WITH_CUDA
  if (device) device->model.download_params(model.params().data());
#endif
}

void Loop::params_to_device() {
#if ATOLL_WITH_CUDA
  if (device) device->model.upload_params(model.params().data());
#endif
}

void Loop::grads_to_host() {
#if ATOLL_WITH_CUDA
  if (device) device->model.download_grads(model.grads().data());
#endif
}

void Loop::grads_to_device() {
#if ATOLL_WITH_CUDA
  if (device) device->model.upload_grads(model.grads().data());
#endif
}

void Loop::join_island(ProcessGroup& island) {
#if ATOLL_WITH_CUDA
  if (!device || island.size() == 1) return;
  check_island_device(cfg.train, island.size());  // on every rank, before anyone waits on another
  const std::vector<std::string> ids = island.allgather(island.rank() == 0 ? gpu::nccl_unique_id() : std::string());
  device->nccl = std::make_unique<gpu::NcclComm>(ids.at(0), island.rank(), island.size(), island.timeout());
#else
  (void)island;
#endif
}

void Loop::average_device_grads() {
#if ATOLL_WITH_CUDA
  ATOLL_CHECK(device && device->nccl) << "average_device_grads() needs the GPU and join_island()";
  device->nccl->allreduce_mean(device->model.grads(), model.layout().total());
#endif
}

std::string Loop::device_name() const {
#if ATOLL_WITH_CUDA
  if (device) return device->name;
#endif
  return "cpu";
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
