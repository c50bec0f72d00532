// The body shared by the "a short training run on the GPU tracks the CPU" tests: AdamW for 30
// steps and Muon for 10, clip included, on the device and on the CPU model from the same
// initial parameters and batches. Each test states how far apart its two runs may drift and
// why (the tolerances), and how much the device run must learn.
#pragma once

#include <gtest/gtest.h>

#include <utility>

#include "atoll/model/device_model.h"
#include "atoll/model/model.h"
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
      const double want_norm = clip_grad_norm(cpu.grads().data(), cpu.grads().size(), oc.grad_clip);
      const double got_norm = dev_opt.clip_grad_norm(dev.grads(), oc.grad_clip);
      EXPECT_NEAR(got_norm, want_norm, tol.norm * want_norm);
      cpu_opt.step(cpu.params().data(), cpu.grads().data(), 3e-3);
      dev_opt.step(dev.params(), dev.grads(), 3e-3);
      (s == 0 ? first : last) = got.ce;
    }
    EXPECT_LT(last, first - tol.learn) << "the device run did not learn";
  }
}

}  // namespace atl::test
