// The memory estimate against a real engine's resident memory (fp32 and bf16, AdamW and Muon,
// small and large activations), and the refusal of a config too large for the machine: fast,
// without allocating, naming the keys that drive the size, the estimate, what is available and
// the fix; train.memory_check = false skips it.
#include "atoll/engine/memory_estimate.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

#include "atoll/config/config.h"
#include "atoll/core/errors.h"
#include "atoll/engine/engine.h"
#include "atoll/model/layout.h"
#include "atoll/optim/zero_shard.h"

namespace atl {
namespace {

// Resident bytes of this process (/proc/self/statm: pages).
double resident_bytes() {
  std::ifstream f("/proc/self/statm");
  double size = 0, resident = 0;
  f >> size >> resident;
  return resident * double(::sysconf(_SC_PAGESIZE));
}

Config config_with(const std::vector<std::string>& sets) {
  // ~11 M parameters (175 MiB of state), so that fixed costs (thread stacks, library caches) are
  // small beside what the estimate counts.
  std::vector<std::string> all = {"model.vocab_size=8192", "model.dim=256",         "model.n_layers=2",
                                  "model.n_heads=4",       "model.n_kv_heads=2",    "model.head_dim=64",
                                  "model.n_experts=8",     "model.expert_hidden=512", "model.seq_len=64",
                                  "train.batch_size=8",    "train.threads=2"};
  all.insert(all.end(), sets.begin(), sets.end());
  return parse_config("", "test", all);
}

// Resident memory an engine adds once it has run a whole step (Muon's buffers and the expert
// routing are allocated on first use), measured in a child process of its own: memory an
// earlier engine freed may stay resident in the allocator's heap and hide the next one's.
double engine_bytes(const Config& cfg);
double measured_bytes(const Config& cfg) {
  int p[2];
  if (::pipe(p) != 0) throw std::runtime_error("pipe");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    double bytes = -1;
    try {
      bytes = engine_bytes(cfg);
    } catch (...) {
    }
    [[maybe_unused]] ssize_t n = ::write(p[1], &bytes, sizeof bytes);
    ::_exit(0);
  }
  ::close(p[1]);
  double bytes = -1;
  if (::read(p[0], &bytes, sizeof bytes) != sizeof bytes) bytes = -1;
  ::close(p[0]);
  ::waitpid(pid, nullptr, 0);
  return bytes;
}

double engine_bytes(const Config& cfg) {
  const double before = resident_bytes();
  std::unique_ptr<Engine> engine = make_engine(cfg);
  engine->init_params(1);
  // One sequence is enough: every buffer is sized for the whole micro-batch when the engine is
  // made, and a step of one sequence is quick on a busy machine.
  const int T = cfg.model.seq_len;
  std::vector<int32_t> in(T), tg(T);
  for (int i = 0; i < T; ++i) in[i] = int32_t(i * 7 % cfg.model.vocab_size), tg[i] = int32_t(i % 97);
  engine->zero_grads();
  engine->forward_backward(in.data(), tg.data(), 1, 1.0);
  engine->clip_grads(1.0);
  engine->optimizer_step(1e-3);
  return resident_bytes() - before;
}

// The estimate is for refusing what cannot fit, so it may be rough, but not by much: within 25%
// of what a real engine holds (libraries' own caches and the allocator's slack are not counted).
TEST(MemoryEstimate, CloseToWhatARealEngineHolds) {
  for (const auto& sets : std::vector<std::vector<std::string>>{
           {"train.batch_size=128"},  // fp32, activations larger than the state
           {"train.precision=bf16"},  // the state and bf16 copies
           {"optim.name=muon", "train.precision=bf16", "train.batch_size=32"},  // Muon's batched buffers
           // Qwen2-MoE's parts: a shared expert's kept rows and shared gradients, q/k/v biases
           {"model.shared_expert_hidden=1024", "model.qkv_bias=true", "train.batch_size=64"}}) {
    const Config cfg = config_with(sets);
    const MemoryEstimate e = estimate_memory(cfg);
    const double real = measured_bytes(cfg);
    ASSERT_GT(real, 0) << "the measuring child failed";
    std::string what;
    for (const auto& s : sets) what += s + " ";
    EXPECT_GT(e.host, 0.75 * real) << what << "estimate " << bytes_text(e.host) << ", real " << bytes_text(real);
    EXPECT_LT(e.host, 1.25 * real) << what << "estimate " << bytes_text(e.host) << ", real " << bytes_text(real);
    EXPECT_EQ(e.device, 0);
  }
}

// configs/zaya1-tiny.toml (CCA, the zaya router, residual scaling) at ZAYA1's router width
// R = 256 and 32 sequences, where the routers' kept states and the merges' kept outputs are a
// third of the activations: the estimate counts them, within the same 25%.
TEST(MemoryEstimate, CloseToWhatARealEngineHoldsForZaya1Tiny) {
  const char* src = std::getenv("ATOLL_SOURCE_DIR");
  const std::string path = std::string(src ? src : ".") + "/configs/zaya1-tiny.toml";
  std::ifstream f(path);
  ASSERT_TRUE(f) << path;
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const Config cfg =
      parse_config(text, path, {"model.router_hidden_size=256", "train.batch_size=32", "train.threads=2"});
  const MemoryEstimate e = estimate_memory(cfg);
  const double real = measured_bytes(cfg);
  ASSERT_GT(real, 0) << "the measuring child failed";
  EXPECT_GT(e.host, 0.75 * real) << "estimate " << bytes_text(e.host) << ", real " << bytes_text(real);
  EXPECT_LT(e.host, 1.25 * real) << "estimate " << bytes_text(e.host) << ", real " << bytes_text(real);
}

TEST(MemoryEstimate, PartsAddUpAndGrowWithTheirKeys) {
  const MemoryEstimate e = estimate_memory(config_with({}));
  EXPECT_DOUBLE_EQ(e.host, e.state + e.activations + e.scratch);
  EXPECT_DOUBLE_EQ(e.state, 16 * e.params);  // parameters, gradients, two moments: fp32 each
  const MemoryEstimate batch = estimate_memory(config_with({"train.batch_size=32"}));
  EXPECT_DOUBLE_EQ(batch.state, e.state);
  EXPECT_NEAR(batch.activations, 4 * e.activations, 1e-4 * batch.activations);  // all but a few counters per token
  const MemoryEstimate micro = estimate_memory(config_with({"train.batch_size=32", "train.micro_batch_size=8"}));
  EXPECT_DOUBLE_EQ(micro.activations, e.activations);  // gradient accumulation keeps one micro-batch
}

// optim.zero1 with M workers per island: each keeps the moments of its shard only (the largest
// of zero_shards), parameters and gradients whole; one worker, or zero1 off, keeps them all.
TEST(MemoryEstimate, Zero1ShardsTheMomentsAmongTheIslandsWorkers) {
  const Config plain = config_with({}), zero1 = config_with({"optim.zero1=true"});
  const double n = estimate_memory(plain).params;
  EXPECT_DOUBLE_EQ(estimate_memory(plain, 4).state, 16 * n);
  EXPECT_DOUBLE_EQ(estimate_memory(zero1, 1).state, 16 * n);
  for (int M : {2, 3, 4}) {
    double largest = 0;
    for (const ZeroShard& s : zero_shards(ParamLayout::build(zero1.model), M)) largest = std::max(largest, double(s.size()));
    const MemoryEstimate e = estimate_memory(zero1, M);
    EXPECT_DOUBLE_EQ(e.state, 8 * n + 8 * largest) << "M = " << M;
    EXPECT_LT(e.state, estimate_memory(plain, M).state) << "M = " << M;
    EXPECT_DOUBLE_EQ(e.host, e.state + e.activations + e.scratch);
  }
}

// train.context_parallel = P: a rank's activations are those of its T_r ≈ T/P tokens (about
// 1/P of one worker's, plus ring attention's blocks in flight), the state is whole; the worker
// that validates builds whole-sequence buffers after freeing its own, so it peaks at P = 1's.
TEST(MemoryEstimate, ContextParallelCountsARanksShareOfEachSequence) {
  const std::vector<std::string> base = {"model.seq_len=2048", "train.batch_size=2", "train.eval_every=0"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), base.begin(), base.end());
    return estimate_memory(config_with(more), 4);
  };
  const MemoryEstimate one = with({});
  for (int P : {2, 4}) {
    const MemoryEstimate e = with({"train.context_parallel=" + std::to_string(P)});
    EXPECT_DOUBLE_EQ(e.state, one.state);
    EXPECT_LT(e.activations, 1.05 * one.activations / P) << "P = " << P << ": the split is counted";
    EXPECT_GT(e.activations, 0.95 * one.activations / P) << "P = " << P;
    EXPECT_GT(e.scratch, 0);
    EXPECT_LT(e.host, one.host) << "P = " << P;
    EXPECT_DOUBLE_EQ(e.validator_host, e.host) << "no evaluation: every worker holds its share";
    const MemoryEstimate validating = with({"train.context_parallel=" + std::to_string(P), "train.eval_every=10"});
    EXPECT_DOUBLE_EQ(validating.host, e.host);
    EXPECT_DOUBLE_EQ(validating.validator_host, with({"train.eval_every=10"}).host) << "P = " << P;
  }
}

TEST(MemoryEstimate, TheGpuHoldsTheStepAndTheHostItsCopies) {
  const MemoryEstimate cpu = estimate_memory(config_with({"train.batch_size=8"}));
  const MemoryEstimate gpu = estimate_memory(config_with({"train.batch_size=8", "train.device=\"cuda\""}));
  EXPECT_DOUBLE_EQ(gpu.device, cpu.host);
  EXPECT_LT(gpu.host, cpu.host);
  EXPECT_GT(gpu.host, cpu.state);
}

// 52 TB of parameters: refused at once, nothing allocated.
Config absurd() {
  return config_with({"model.dim=16384", "model.n_layers=64", "model.n_experts=64", "model.expert_hidden=65536"});
}

TEST(MemoryCheck, AnAbsurdModelIsRefusedWithoutAllocating) {
  const double before = resident_bytes();
  std::string e;
  try {
    check_memory_fits(absurd());
  } catch (const ConfigError& x) {
    e = x.what();
  }
  EXPECT_LT(resident_bytes() - before, 16.0 * 1024 * 1024);
  for (const char* s : {"TiB", "model.dim", "model.n_experts", "model.expert_hidden", "train.micro_batch_size",
                        "model.seq_len", "available", "/proc/meminfo", "fix:", "train.memory_check = false"})
    EXPECT_NE(e.find(s), std::string::npos) << s << " not in: " << e;
}

TEST(MemoryCheck, AnAbsurdBatchNamesTheBatchFirst) {
  std::string e;
  try {
    check_memory_fits(config_with({"train.batch_size=65536", "model.seq_len=65536"}));
  } catch (const ConfigError& x) {
    e = x.what();
  }
  const size_t batch = e.find("train.micro_batch_size"), model = e.find("model.dim");
  ASSERT_NE(batch, std::string::npos) << e;
  ASSERT_NE(model, std::string::npos) << e;
  EXPECT_LT(batch, model) << e;
  EXPECT_NE(e.find("65536 sequences of 65536 tokens"), std::string::npos) << e;
}

// Context extension: a run that fits at its first phase's length is refused when a later
// phase's longer sequences and batch would not fit, before anything runs.
TEST(MemoryCheck, TheLargestDataPhaseCounts) {
  Config cfg = config_with({});
  EXPECT_NO_THROW(check_memory_fits(cfg));
  cfg.data.phases = {{.at_tokens = 0, .mix = {{"web", 1.0}}},
                     {.at_tokens = 1000, .mix = {{"web", 1.0}}, .seq_len = 65536, .batch_size = 65536},
                     {.at_tokens = 2000, .mix = {{"web", 1.0}}, .seq_len = 65536, .batch_size = 1}};
  cfg.train.micro_batch_size = 0;
  std::string e;
  try {
    check_memory_fits(cfg);
  } catch (const ConfigError& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("65536 sequences of 65536 tokens"), std::string::npos) << e;
  EXPECT_NE(e.find("the largest phase's of data.phases"), std::string::npos) << e;
}

TEST(MemoryCheck, WorkerProcessesOnOneMachineAddUp) {
  // One worker fits; as many as it takes to exceed what is available do not.
  const Config cfg = config_with({});
  EXPECT_NO_THROW(check_memory_fits(cfg));
  const AvailableMemory have = available_host_memory();
  ASSERT_GT(have.bytes, 0);
  const int processes = int(have.bytes / estimate_memory(cfg).host) + 1;
  std::string e;
  try {
    check_memory_fits(cfg, {.processes = processes});
  } catch (const ConfigError& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("for " + std::to_string(processes) + " worker processes"), std::string::npos) << e;
}

TEST(MemoryCheck, TurnedOffWhenTheEstimateIsWrong) {
  Config cfg = absurd();
  cfg.train.memory_check = false;
  EXPECT_NO_THROW(check_memory_fits(cfg));
}

// `ulimit -v`: the address-space limit bounds what is available (it was ignored, and a model
// over it ended in std::bad_alloc). In a child, so the limit does not stay with the test.
TEST(MemoryEstimate, TheAddressSpaceLimitBoundsTheMemoryAvailable) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::ifstream statm("/proc/self/statm");
    double pages = 0;
    statm >> pages;
    const double mapped = pages * double(::sysconf(_SC_PAGESIZE));
    const rlimit lim{.rlim_cur = rlim_t(mapped) + (rlim_t(256) << 20), .rlim_max = RLIM_INFINITY};
    ::setrlimit(RLIMIT_AS, &lim);
    const AvailableMemory a = available_host_memory();
    const double got[2] = {a.bytes, a.source.find("ulimit -v") != std::string::npos ? 1.0 : 0.0};
    [[maybe_unused]] const ssize_t n = ::write(fds[1], got, sizeof got);
    ::_exit(0);
  }
  double got[2] = {0, 0};
  ASSERT_EQ(::read(fds[0], got, sizeof got), ssize_t(sizeof got));
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(fds[0]), ::close(fds[1]);
  EXPECT_GT(got[0], 0.0);
  EXPECT_LE(got[0], double(256 << 20)) << "the room under the limit, not the machine's memory";
  EXPECT_EQ(got[1], 1.0) << "the message names ulimit -v";
}

}  // namespace
}  // namespace atl
