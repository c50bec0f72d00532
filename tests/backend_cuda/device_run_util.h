// The body shared by the "a short training run on the GPU tracks the CPU" tests: AdamW for 30
// steps and Muon for 10, clip included, on the device and on the CPU model from the same
// initial parameters and batches. Each test states how far apart its two runs may drift and
// why (the tolerances), and how much the device run must learn. A model with zaya routers also
// balances their biases after each step on both sides (optim/bias_balance.h), their loads left
// out of the norm; the balanced rows must end where the CPU's do.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "atoll/model/device_model.h"
#include "atoll/model/model.h"
#include "atoll/optim/bias_balance.h"
#include "atoll/optim/clip.h"
#include "atoll/optim/device_optimizer.h"
#include "atoll/optim/optimizer.h"
#include "gpu_test_util.h"

namespace atl::test {

struct RunTolerance {
  double loss;   // |device ce − cpu ce| <= loss · cpu ce, every step
  double norm;   // |device grad norm − cpu grad norm| <= norm · cpu norm, every step
  double learn;  // the device's last loss at least this far below its first
};

// The balancing biases after the runs (none without zaya routers). Both sides balance on loads
// that are counts of the same choices, so they move alike; a choice that a near-tie breaks the
// other way late in the run shifts one load by 1/(N*K) and the AdamW step on it (normalised)
// only slightly. Hence: within a tenth of the largest distance the CPU's biases moved, which
// must be more than nothing (the balancing ran).
inline void expect_balanced_rows_track(const Model<float>& cpu, const gpu::DeviceModel& dev,
                                       const std::vector<float>& start) {
  std::vector<float> got(cpu.layout().total());
  dev.download_params(got.data());
  for (const ParamEntry* row : balanced_rows(cpu.layout())) {
    SCOPED_TRACE(row->name);
    double moved = 0;
    for (size_t i = row->offset; i < row->offset + row->numel; ++i)
      moved = std::max(moved, std::fabs(double(cpu.params()[i]) - start[i]));
    EXPECT_GT(moved, 0.0) << "bias balancing never moved the biases";
    for (size_t i = row->offset; i < row->offset + row->numel; ++i)
      EXPECT_NEAR(got[i], cpu.params()[i], 0.1 * moved) << "class " << i - row->offset;
  }
}

inline void expect_run_tracks_cpu(const ModelConfig& m, int B, const gpu::DeviceModelOptions& dev_opts,
                                  Precision cpu_precision, const RunTolerance& tol) {
  for (const auto& [name, steps] : {std::pair<const char*, int>{"adamw", 30}, {"muon", 10}}) {
    SCOPED_TRACE(name);
    OptimConfig oc;
    oc.name = name;
    oc.grad_clip = 1.0;
    Model<float> cpu(m, B, cpu_precision);
    cpu.init_params(21);
    gpu::DeviceModel dev(m, B, dev_opts);
    dev.upload_params(cpu.params().data());
    const std::vector<float> start = cpu.params();
    Optimizer cpu_opt(oc, cpu.layout());
    gpu::DeviceOptimizer dev_opt(oc, dev.layout());
    Rng rng(99);
    double first = 0, last = 0;
    for (int s = 0; s < steps; ++s) {
      SCOPED_TRACE(testing::Message() << "step " << s);
      const Batch b = make_batch(rng, B, m.seq_len, m.vocab_size);
      cpu.zero_grads();
      dev.zero_grads();
      const LossParts want = cpu.forward_backward(b.in.data(), b.tg.data(), B);
      const LossParts got = dev.forward_backward(b.in.data(), b.tg.data(), B);
      ASSERT_NEAR(got.ce, want.ce, tol.loss * want.ce);
      const double want_norm =
          clip_grad_norm(cpu.grads().data(), cpu.grads().size(), oc.grad_clip, balanced_spans(cpu.layout()));
      const double got_norm = dev_opt.clip_grad_norm(dev.grads(), oc.grad_clip);
      EXPECT_NEAR(got_norm, want_norm, tol.norm * want_norm);
      cpu_opt.step(cpu.params().data(), cpu.grads().data(), 3e-3);
      dev_opt.step(dev.params(), dev.grads(), 3e-3);
      (s == 0 ? first : last) = got.ce;
    }
    EXPECT_LT(last, first - tol.learn) << "the device run did not learn";
    expect_balanced_rows_track(cpu, dev, start);
  }
}

}  // namespace atl::test
