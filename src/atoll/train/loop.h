// What one training process holds and does per step, shared by the single-process trainer
// (trainer.h) and the island worker (island_trainer.h): the model, the inner optimizer, this
// worker's slice of the training data and the validation split; one batch's gradients with
// gradient accumulation over micro-batches; validation; the checkpoint state.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/config/config.h"
#include "atoll/data/loader.h"
#include "atoll/model/model.h"
#include "atoll/optim/optimizer.h"

namespace atl {

int micro_batch(const TrainConfig& t);

// Mean cross-entropy over the first eval_batches micro-batches of the validation split.
double evaluate(Model<float>& model, DataLoader& val, const Config& cfg);

struct Loop {
  const Config& cfg;
  Model<float> model;
  Optimizer opt;
  DataLoader train_data;
  std::unique_ptr<DataLoader> val_data;  // absent when the data has no validation split
  int64_t step = 0, tokens = 0;
  std::vector<int32_t> in, tg;  // [micro_batch, T] inputs and targets

  // Worker `worker` of `n_workers` reads its own slice of the training data (loader.h).
  Loop(const Config& c, const std::string& data_dir, int worker = 0, int n_workers = 1);

  // zero grads, then forward/backward over batch / micro_batch micro-batches of the next
  // `batch` training windows: grads [layout.total()] hold the batch mean. Returns the mean loss.
  LossParts gradients(int batch);

  std::vector<CheckpointBuffer> buffers();
  nlohmann::json state() const;
  void restore(const nlohmann::json& s);
};

}  // namespace atl
