// Every value is checked where it enters: each config key refuses what it cannot mean (out of
// range, not finite, a bound that is open) with an error naming the key and the fix, and takes
// the edges it can mean. Cross-field rules (decay that would flip the weights, a tokenizer too
// small for its byte pieces) too. Table-driven: one row per key and bad value.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/config/context_parallel.h"
#include "atoll/core/errors.h"

namespace atl {
namespace {

// The error of the default config with `sets` applied ("" when it loads).
std::string error_of(const std::vector<std::string>& sets) {
  try {
    parse_config("", "t.toml", sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

struct Bad {
  std::string set;   // key=value
  std::string name;  // what the error must name besides the key
};

// Values each key cannot mean. Several of these loaded before and failed later (a NaN loss
// blamed on the learning rate, a timeout of 0 s, an infinite RoPE base).
const std::vector<Bad> kBad = {
    {"model.rope_theta=inf", "finite"},
    {"model.rope_theta=nan", "finite"},
    {"model.rope_theta=0.5", "out of range"},
    {"model.rope_theta_local=nan", "finite"},
    {"model.rope_theta_local=0.5", "out of range"},
    {"model.norm_eps=0.0", "out of range"},
    {"model.norm_eps=-1e-6", "out of range"},
    {"model.aux_loss_coef=inf", "finite"},
    {"model.aux_loss_coef=-0.1", "out of range"},
    {"model.z_loss_coef=nan", "finite"},
    {"model.router_hidden_size=0", "out of range"},
    {"model.router_skip_bias=nan", "finite"},
    {"model.router_skip_bias=2.0", "out of range"},
    {"model.init_std=inf", "finite"},
    {"model.init_std=-0.02", "out of range"},
    {"model.vocab_size=1", "out of range"},
    {"model.dim=0", "out of range"},
    {"model.seq_len=0", "out of range"},
    {"model.head_dim=1", "out of range"},
    {"model.partial_rotary_factor=0", "out of range"},
    {"model.partial_rotary_factor=1.5", "out of range"},
    {"model.partial_rotary_factor=nan", "finite"},
    {"model.cca_time0=0", "out of range"},
    {"model.cca_time1=65", "out of range"},
    {"model.n_layers=0", "out of range"},
    {"model.n_heads=0", "out of range"},
    {"model.n_kv_heads=0", "out of range"},
    {"model.n_experts=0", "out of range"},
    {"model.top_k=0", "out of range"},
    {"model.expert_hidden=0", "out of range"},
    {"model.shared_expert_hidden=-1", "out of range"},
    {"model.init_seed=-1", "out of range"},
    {"train.seed=-1", "out of range"},
    {"train.batch_ramp_start=-1", "out of range"},
    {"train.batch_ramp_tokens=-1", "out of range"},
    {"train.eval_every=-1", "out of range"},
    {"train.peak_gflops=-2", "out of range"},
    {"train.steps=-1", "out of range"},
    {"train.batch_size=0", "out of range"},
    {"train.micro_batch_size=-1", "out of range"},
    {"train.eval_batches=0", "out of range"},
    {"train.log_every=0", "out of range"},
    {"train.threads=-1", "out of range"},
    {"train.context_parallel=0", "out of range"},
    {"optim.lr=-0.001", "out of range"},
    {"optim.lr=inf", "finite"},
    {"optim.lr=nan", "finite"},
    {"optim.min_lr_ratio=1.5", "out of range"},
    {"optim.warmup_steps=-1", "out of range"},
    {"optim.decay_frac=1.1", "out of range"},
    {"optim.beta1=1.0", "out of range"},
    {"optim.beta1=-0.1", "out of range"},
    {"optim.beta2=1.0", "out of range"},
    {"optim.eps=0.0", "out of range"},
    {"optim.eps=nan", "finite"},
    {"optim.weight_decay=-0.1", "out of range"},
    {"optim.weight_decay=inf", "finite"},
    {"optim.grad_clip=-1.0", "out of range"},
    {"optim.grad_clip=inf", "finite"},
    {"optim.muon_momentum=1.0", "out of range"},
    {"optim.ns_steps=0", "out of range"},
    {"optim.bias_balance_lr=-0.001", "out of range"},
    {"optim.bias_balance_lr=inf", "finite"},
    {"data.vocab_size=-1", "out of range"},
    {"data.val_fraction=0.9", "out of range"},
    {"data.val_fraction=nan", "finite"},
    {"diloco.inner_steps=0", "out of range"},
    {"diloco.outer_lr=0.0", "out of range"},
    {"diloco.outer_lr=inf", "finite"},
    {"diloco.outer_momentum=1.0", "out of range"},
    {"diloco.outer_momentum=-0.5", "out of range"},
    {"diloco.fragments=0", "out of range"},
    {"diloco.overlap_steps=-1", "out of range"},
    {"diloco.mixing=nan", "finite"},
    {"diloco.connections=0", "out of range"},
    {"diloco.chunk_kb=0", "out of range"},
    {"diloco.dp_warmup_steps=-1", "out of range"},
    {"diloco.sync_seconds=-1", "out of range"},
    {"diloco.sync_seconds=nan", "finite"},
    {"diloco.expert_topk=1.5", "out of range"},
    {"diloco.expert_topk=nan", "finite"},
    {"diloco.outer_delay=2", "out of range"},
    {"diloco.outer_delay=-1", "out of range"},
    {"checkpoint.every=-1", "out of range"},
    {"checkpoint.keep=0", "out of range"},
    {"checkpoint.grace_s=-1.0", "out of range"},
    {"fault.timeout_s=0.0", "out of range"},
    {"fault.timeout_s=-5.0", "out of range"},
    {"fault.timeout_s=inf", "finite"},
    {"fault.timeout_s=nan", "finite"},
    {"fault.timeout_s=0.0001", "out of range"},  // below a millisecond: waits count whole ms
    {"fault.timeout_s=1e300", "out of range"},   // would overflow the millisecond count
    {"fault.max_restarts=-1", "out of range"},
    {"fault.restart_backoff_s=-1.0", "out of range"},
    {"fault.restart_backoff_s=nan", "finite"},
    {"fault.heartbeat_s=0.001", "out of range"},  // below 10 ms: heartbeats are timed in whole ms
    {"fault.heartbeat_s=inf", "finite"},
    {"fault.heartbeat_ttl_s=0.0", "out of range"},
    {"fault.clip_factor=-1.0", "out of range"},
    {"fault.clip_factor=nan", "finite"},
    {"fault.min_cosine=1.5", "out of range"},
    {"fault.outer_deadline_s=-1", "out of range"},
    {"fault.outer_deadline_s=nan", "finite"},
    {"fault.spike_factor=-0.5", "out of range"},
    {"fault.spike_window=2", "out of range"},  // a median of fewer than 3 is no median
    {"fault.step_timeout_s=-1", "out of range"},
    {"fault.step_timeout_s=inf", "finite"},
    {"fault.rejoin_timeout_s=-1", "out of range"},
    {"fault.rejoin_timeout_s=nan", "finite"},
};

TEST(ConfigRanges, EveryKeyRefusesWhatItCannotMean) {
  for (const Bad& b : kBad) {
    const std::string key = b.set.substr(0, b.set.find('='));
    const std::string e = error_of({b.set});
    EXPECT_NE(e.find("--set " + b.set), std::string::npos) << b.set << " -> " << e;
    EXPECT_NE(e.find(key + ":"), std::string::npos) << b.set << " -> " << e;
    EXPECT_NE(e.find(b.name), std::string::npos) << b.set << " -> " << e;
    EXPECT_NE(e.find("fix: use a"), std::string::npos) << b.set << " -> " << e;
  }
}

TEST(ConfigRanges, TheSameRulesHoldInAFile) {
  const std::string e = [] {
    try {
      parse_config("[optim]\nbeta2 = 1.0\n", "f.toml");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_NE(e.find("f.toml: optim.beta2: value 1.0 is out of range; fix: use a value in [0, 1)"), std::string::npos)
      << e;
}

TEST(ConfigRanges, EveryKeyTakesTheEdgesItCanMean) {
  const std::vector<std::string> good = {
      "model.norm_eps=1e-12",     "model.rope_theta=1.0",  "model.init_std=0.0",     "train.steps=0",
      "optim.lr=0.0",             "optim.beta1=0.0",       "optim.beta2=0.999999",   "optim.eps=1e-30",
      "optim.weight_decay=0.0",   "optim.grad_clip=0.0",   "optim.muon_momentum=0.0", "optim.min_lr_ratio=1.0",
      "optim.decay_frac=0.0",     "data.val_fraction=0.0", "data.vocab_size=0",      "data.vocab_size=260",
      "diloco.outer_lr=1e-6",     "diloco.outer_momentum=0.0", "diloco.mixing=1.0",  "fault.timeout_s=0.001",
      "fault.timeout_s=1000000.0", "fault.max_restarts=0", "fault.restart_backoff_s=0.0", "checkpoint.every=0",
      "model.router_skip_bias=-10000.0", "model.router_skip_bias=1.0", "optim.bias_balance_lr=0.0",
      "model.rope_theta_local=1.0"};
  for (const std::string& s : good) EXPECT_EQ(error_of({s}), "") << s;
}

TEST(ConfigRanges, DecayThatWouldZeroOrFlipTheWeightsIsRefused) {
  // Decoupled decay multiplies each weight by 1 - lr * weight_decay every step.
  const std::string e = error_of({"optim.lr=2.0", "optim.weight_decay=0.5"});
  EXPECT_NE(e.find("optim.lr"), std::string::npos) << e;
  EXPECT_NE(e.find("optim.weight_decay"), std::string::npos) << e;
  EXPECT_NE(e.find("fix:"), std::string::npos) << e;
  EXPECT_EQ(error_of({"optim.lr=2.0", "optim.weight_decay=0.0"}), "");
  EXPECT_EQ(error_of({"optim.lr=1.0", "optim.weight_decay=0.9"}), "");
}

TEST(ConfigRanges, ATokenizerTooSmallForItsBytePiecesIsRefused) {
  // 256 byte pieces and 3 specials come before any piece of the corpus.
  for (const char* v : {"1", "64", "259"}) {
    const std::string e = error_of({std::string("data.vocab_size=") + v});
    EXPECT_NE(e.find("data.vocab_size"), std::string::npos) << v << " -> " << e;
    EXPECT_NE(e.find("260"), std::string::npos) << v << " -> " << e;
    EXPECT_NE(e.find("fix:"), std::string::npos) << v << " -> " << e;
  }
}

TEST(ConfigRanges, EveryNumberKeyIsCoveredByABadCase) {
  // A key added later must come with its bad values here.
  for (const ConfigKeyInfo& k : config_keys()) {
    if (k.type != "int" && k.type != "float") continue;
    bool covered = false;
    for (const Bad& b : kBad) covered |= b.set.rfind(k.key + "=", 0) == 0;
    EXPECT_TRUE(covered) << k.key << " has no bad case in kBad";
  }
}

TEST(ConfigRanges, ShippedConfigsStillLoad) {
  const char* src = std::getenv("ATOLL_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(src) + "/configs")) {
    if (e.path().extension() != ".toml") continue;
    EXPECT_NO_THROW(load_config(e.path().string())) << e.path();
    ++n;
  }
  EXPECT_GT(n, 0);
}

// train.context_parallel's refusals (config/context_parallel.h), each naming the key, the reason
// and the fix: a P that does not divide the island's workers (or any P > 1 for `atoll train`'s
// one worker), chunks of ⌊T/2P⌋ tokens shorter than the previous-chunk window the model reads,
// bf16 products. What is supported loads: GQA, and CCA whose chunks hold its window, on the CPU
// and the GPU.
// check_context_parallel's error for `workers` workers per island ("" when it passes).
std::string placement_error(int P, int workers) {
  Config c;
  c.train.context_parallel = P;
  try {
    check_context_parallel(c, workers);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

void expect_names(const std::string& e, const std::vector<std::string>& words) {
  EXPECT_FALSE(e.empty());
  for (const std::string& w : words) EXPECT_NE(e.find(w), std::string::npos) << "'" << w << "' not in: " << e;
}

TEST(ContextParallelConfig, PMustDivideTheIslandsWorkers) {
  expect_names(placement_error(2, 3), {"train.context_parallel = 2", "--workers-per-island", "fix:"});
  expect_names(placement_error(4, 6), {"train.context_parallel = 4", "divide", "fix:"});
  expect_names(placement_error(2, 1), {"atoll train", "atoll launch", "fix:"});
  for (const auto& [P, M] : {std::pair{1, 1}, {1, 3}, {2, 2}, {2, 4}, {3, 6}}) EXPECT_EQ(placement_error(P, M), "");
}

TEST(ContextParallelConfig, AChunkShorterThanTheModelsBoundaryIsRefused) {
  // CCA reads cca_time0-1 + cca_time1-1 = 3 tokens back (at the defaults below); seq_len 20 over
  // P = 4 gives chunks of ⌊20/8⌋ = 2.
  const std::vector<std::string> cca = {"model.attention=\"cca\"", "model.cca_time0=2", "model.cca_time1=3",
                                        "model.seq_len=20", "train.context_parallel=4"};
  expect_names(error_of(cca), {"train.context_parallel = 4", "chunks of 2", "3 tokens", "fix:"});
  // One token more per chunk is the window exactly: it loads (model/chunk_boundary.h).
  std::vector<std::string> fits = cca;
  fits[3] = "model.seq_len=24";
  EXPECT_EQ(error_of(fits), "");
}

TEST(ContextParallelConfig, WhatIsNotBuiltYetIsRefusedNotRunWrong) {
  expect_names(error_of({"train.precision=\"bf16\"", "train.context_parallel=2"}),
               {"train.context_parallel = 2", "fp32", "fix:"});
}

TEST(ContextParallelConfig, GqaOnTheCpuLoads) {
  // T need not divide by 2P; chunks may even be empty (T < 2P) for GQA, which reads no boundary.
  EXPECT_EQ(error_of({"model.seq_len=29", "train.context_parallel=2"}), "");
  EXPECT_EQ(error_of({"model.seq_len=5", "train.context_parallel=4"}), "");
  EXPECT_EQ(error_of({"model.router=\"zaya\"", "train.context_parallel=3"}), "");
}

// On the GPU every part kind runs over a split sequence too (the device ring, CCA's boundary
// exchange, the zaya router's loads as shares of the whole sequences: gpu::DeviceModel), within
// the CPU's limits: a CCA chunk shorter than its window is refused there as here.
TEST(ContextParallelConfig, EveryPartKindLoadsOnTheGpuToo) {
  EXPECT_EQ(error_of({"train.device=\"cuda\"", "model.seq_len=29", "train.context_parallel=2"}), "");  // GQA, top-k
  EXPECT_EQ(error_of({"train.device=\"cuda\"", "model.router=\"zaya\"", "train.context_parallel=2"}), "");
  const std::vector<std::string> zaya1 = {"train.device=\"cuda\"", "model.attention=\"cca\"", "model.router=\"zaya\"",
                                          "model.cca_time0=2",         "model.cca_time1=3",         "model.seq_len=24",
                                          "train.context_parallel=4"};
  EXPECT_EQ(error_of(zaya1), "");  // chunks of 3: the window exactly
  std::vector<std::string> short_chunks = zaya1;
  short_chunks[5] = "model.seq_len=20";
  expect_names(error_of(short_chunks), {"train.context_parallel = 4", "chunks of 2", "3 tokens", "fix:"});
}

}  // namespace
}  // namespace atl
