#include "atoll/engine/memory_estimate.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "atoll/core/errors.h"
#include "atoll/engine/cuda_engine.h"
#include "atoll/engine/engine.h"
#include "atoll/model/layout.h"
#include "atoll/model/part_kinds.h"
#include "atoll/model/precision.h"
#include "atoll/model/ring_attention.h"
#include "atoll/optim/muon.h"
#include "atoll/optim/zero_shard.h"

namespace atl {
namespace {

constexpr double kF32 = 4, kBf16 = 2, kI32 = 4;
constexpr double kHeadChunk = 256;   // rows of logits alive at once (model.cc)
constexpr double kExpertChunk = 2048;  // dispatched rows per expert chunk (experts_swiglu.h)

// Activations one model keeps for `B` sequences, and its largest scratch (bytes), as the
// buffers of model/model.cc, block.cc and the parts allocate them.
struct ModelBytes {
  double activations = 0, scratch = 0;
};
ModelBytes model_bytes(const ModelConfig& m, double B, double T, bool bf16) {
  const double N = B * T, C = m.dim, L = m.n_layers, E = m.n_experts, K = m.top_k,
               H = m.expert_hidden, QD = double(m.n_heads) * m.head_dim, KVD = double(m.n_kv_heads) * m.head_dim,
               R = N * K;
  const double kept = bf16 ? kBf16 : kF32;  // the expert rows
  const CostShape shape{.B = B, .T = T, .bf16 = bf16};
  ModelBytes b;
  // Per block: the two norms' statistics, the residual between the sub-layers (fp32 only), the
  // experts' hidden rows (two in fp32, one in bf16) and their routing; and what the layer's
  // attention and router kinds keep (model/part_kinds.h), the scratch each kind in use shares,
  // and the largest work buffer a kind needs.
  const double per_block = kF32 * (2 * N + (bf16 ? 0 : N * C)) + kept * R * H * (bf16 ? 1 : 2) + kI32 * (2 * R + E + 1);
  // The residual stream entering every block, the buffers the blocks share, the tokens.
  b.activations = L * per_block + kF32 * ((L + 1) * N * C + 4 * N * C + N * K + N) + kI32 * N;
  double part_work = 0;
  std::set<std::string_view> shared;
  for (int l = 0; l < m.n_layers; ++l) {
    const AttentionKind& a = attention_kind_at(m, l);
    const RouterKind& r = router_kind_at(m, l);
    b.activations += a.kept_bytes(m, shape) + r.kept_bytes(m, shape);
    if (shared.insert(a.name).second) b.activations += a.shared_bytes(m, shape);
    if (shared.insert(r.name).second) b.activations += r.shared_bytes(m, shape);
    part_work = std::max({part_work, a.work_bytes(m, shape), r.work_bytes(m, shape)});
  }
  // The shared expert (model/shared_expert.h) keeps W1s h, W3s h, their SwiGLU [N,HS], its output
  // [N,C] and the gate [N] per block; its backward's gradients (and bf16 operands) are shared.
  if (const double HS = m.shared_expert_hidden; HS > 0) {
    b.activations += L * kF32 * (3 * N * HS + N * C + N) + kF32 * (N * C + 2 * N * HS + N);
    if (bf16) b.activations += kBf16 * (N * HS + N * std::max(C, HS) + N);
  }
  // Residual scaling (model/norm_residual.h ResidualMerge) keeps each merge's sub-layer output
  // [N,C]: two merges per block and the embedding's.
  if (m.residual_scaling) b.activations += kF32 * (2 * L + 1) * N * C;
  // Scratch shared by the layers: the router's logits and their gradient, the experts' row
  // weights, and under bf16 the products' rounded inputs and output gradients.
  b.activations += kF32 * (2 * N * E + 2 * R);
  if (bf16) b.activations += kBf16 * (N * C + N * std::max({C, QD, KVD}) + 2 * N * C + N * C);
  // The work buffer: the head's logits chunk, a part's, or one expert chunk's.
  const double chunk = std::min(kExpertChunk, R);
  b.scratch = std::max({kF32 * kHeadChunk * m.vocab_size, part_work, kF32 * chunk * (3 * C + 3 * H)});
  if (bf16) b.scratch += kBf16 * (m.vocab_size * C + kHeadChunk * m.vocab_size);  // the head's weights and d(logits) in bf16
  return b;
}

// Muon's Newton-Schulz buffers (optim/muon.cc) for the largest hidden matrix (m = min(rows,
// cols), n = rows * cols): fp32 products give each thread the update, X and A = X Xt, B (3n + 2m²
// floats); bf16 products batch matrices of one shape up to kMuonBatchElements, with the update
// and X in fp32, X, A and B in bf16.
double muon_scratch(const Config& cfg, const ParamLayout& layout, bool bf16) {
  if (cfg.optim.name != "muon") return 0;
  double n = 0, mm = 0;
  for (const ParamEntry& e : layout.entries()) {
    if (!e.is_hidden_matrix()) continue;
    const double m = double(std::min(e.matrix_rows, e.matrix_cols));
    n = std::max(n, double(e.matrix_rows) * double(e.matrix_cols)), mm = std::max(mm, m * m);
  }
  if (bf16) {
    const double batch = std::max(1.0, std::floor(double(kMuonBatchElements) / std::max(n, 1.0)));
    return batch * (n * (2 * kF32 + kBf16) + 2 * kBf16 * mm);
  }
  const double threads = cfg.train.threads > 0 ? cfg.train.threads : std::max(1u, std::thread::hardware_concurrency());
  return threads * kF32 * (3 * n + 2 * mm);
}

// The tokens of each sequence the largest rank of context parallelism holds (T for P = 1).
double rank_tokens(int T, int P) {
  int most = 0;
  for (int r = 0; r < P; ++r) most = std::max(most, ZigzagLayout{.T = T, .P = P}.local_len(r));
  return most;
}

// Ring attention's buffers while a layer's attention runs (model/ring_attention.cc): in the
// backward, the key/value block in hand and the one arriving, this rank's gradient share of a
// block, the sums arriving and the sums passed on (five blocks of [k|v] rows) and D; each
// thread's two score tiles of 64 rows by a chunk.
double ring_scratch(const Config& cfg, double B, double Tr) {
  const ModelConfig& m = cfg.model;
  const int P = cfg.train.context_parallel;
  if (P <= 1) return 0;
  const double KVD = double(m.n_kv_heads) * m.head_dim, chunk = std::ceil(double(m.seq_len) / (2.0 * P));
  const double threads = cfg.train.threads > 0 ? cfg.train.threads : std::max(1u, std::thread::hardware_concurrency());
  return kF32 * (5 * 2 * B * Tr * KVD + B * m.n_heads * Tr + threads * 2 * 64 * chunk);
}

double read_number(const std::string& path) {
  std::ifstream f(path);
  double x = 0;
  return f >> x ? x : 0;
}

}  // namespace

MemoryEstimate estimate_memory(const Config& cfg, int workers_per_island) {
  const ModelConfig& m = cfg.model;
  const bool bf16 = parse_precision(cfg.train.precision) == Precision::kBf16;
  const ParamLayout layout = ParamLayout::build(m);
  MemoryEstimate e;
  e.params = double(layout.total());
  // Parameters, gradients and the two moments, one float each per parameter; ZeRO-1 keeps the
  // moments of one shard (engine.cc: whole tensors per shard, so the largest may exceed 1/M).
  double moments = e.params;
  if (cfg.optim.zero1 && workers_per_island > 1) {
    moments = 0;
    for (const ZeroShard& s : zero_shards(layout, workers_per_island)) moments = std::max(moments, double(s.size()));
  }
  e.state = 2 * kF32 * e.params + 2 * kF32 * moments;
  const double B = micro_batch(cfg.train), Tr = rank_tokens(m.seq_len, cfg.train.context_parallel);
  const ModelBytes micro = model_bytes(m, B, Tr, bf16);
  e.activations = micro.activations;
  e.scratch = micro.scratch + ring_scratch(cfg, B, Tr) + muon_scratch(cfg, layout, bf16);
  if (cfg.train.device != "cuda") {
    e.host = e.validator_host = e.state + e.activations + e.scratch;
    if (cfg.train.context_parallel > 1 && cfg.train.eval_every > 0) {
      Config whole = cfg;  // the validating worker leaves the ring for whole sequences
      whole.train.context_parallel = 1;
      e.validator_host = std::max(e.host, estimate_memory(whole, workers_per_island).host);
    }
    return e;
  }
  // The GPU holds the working state, the activations and scratch (and under bf16 every
  // parameter rounded once per forward); the host keeps copies of the state and a model of
  // one sequence.
  const ModelBytes one = model_bytes(m, 1, m.seq_len, bf16);
  e.device = e.state + e.activations + e.scratch + (bf16 ? kBf16 * e.params : 0);
  e.host = e.validator_host = e.state + one.activations + one.scratch;
  return e;
}

AvailableMemory available_host_memory() {
  AvailableMemory a;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream words(line);
    std::string name;
    double kib = 0;
    if (words >> name >> kib && name == "MemAvailable:") a = {kib * 1024, "MemAvailable in /proc/meminfo"};
  }
  // cgroup v2: memory.max is "max" (no limit, reads as 0 here) or the limit in bytes.
  const double limit = read_number("/sys/fs/cgroup/memory.max");
  if (limit > 0) {
    const double room = std::max(0.0, limit - read_number("/sys/fs/cgroup/memory.current"));
    if (a.bytes <= 0 || room < a.bytes) a = {room, "this cgroup's memory.max less memory.current"};
  }
  // `ulimit -v` (RLIMIT_AS) caps the address space, which counts every mapping already made.
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    std::ifstream statm("/proc/self/statm");
    double pages = 0;
    statm >> pages;
    const double room = std::max(0.0, double(as.rlim_cur) - pages * double(::sysconf(_SC_PAGESIZE)));
    if (a.bytes <= 0 || room < a.bytes) a = {room, "the address-space limit (ulimit -v) less what this process maps"};
  }
  return a;
}

std::string bytes_text(double bytes) {
  char buf[64];
  constexpr double kMiB = 1024.0 * 1024.0, kGiB = 1024.0 * kMiB, kTiB = 1024.0 * kGiB;
  if (bytes >= kTiB) std::snprintf(buf, sizeof buf, "%.1f TiB", bytes / kTiB);
  else if (bytes >= kGiB) std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / kGiB);
  else std::snprintf(buf, sizeof buf, "%.0f MiB", bytes / kMiB);
  return buf;
}

namespace {

// The refusal: what the estimate is made of, the keys that drive the larger part first, what is
// available and where that figure comes from, and the fix.
[[noreturn]] void too_large(const Config& cfg, const MemoryEstimate& e, double need, const std::string& memory,
                            int processes, const AvailableMemory& have) {
  const std::string state_keys =
      "model.dim, model.n_layers, model.n_experts, model.expert_hidden or model.vocab_size (the parameters)";
  const std::string batch_keys =
      "train.micro_batch_size (gradients accumulate up to train.batch_size) or model.seq_len (the activations)" +
      std::string(cfg.data.phases.empty() ? "" : ", the largest phase's of data.phases");
  char params[32];
  std::snprintf(params, sizeof params, "%.3g", e.params);
  const std::string parts =
      "parameters, gradients and optimizer moments " + bytes_text(e.state) + " for " + params +
      " parameters; activations kept for backward " + bytes_text(e.activations) + " for " +
      std::to_string(micro_batch(cfg.train)) + " sequences of " + std::to_string(cfg.model.seq_len) + " tokens" +
      (cfg.train.context_parallel > 1
           ? " (a rank's " + std::to_string(int(rank_tokens(cfg.model.seq_len, cfg.train.context_parallel))) +
                 " of each under train.context_parallel = " + std::to_string(cfg.train.context_parallel) + ")"
           : "") +
      "; largest scratch " + bytes_text(e.scratch);
  const std::string each = processes > 1 ? " for " + std::to_string(processes) + " worker processes" : "";
  const bool state_first = e.state >= e.activations;
  throw ConfigError("the model and batch need about " + bytes_text(need) + " of " + memory + each + " (" + parts +
                    "), more than the " + bytes_text(have.bytes) + " available (" + have.source + "); fix: lower " +
                    (state_first ? state_keys + ", or " + batch_keys : batch_keys + ", or " + state_keys) +
                    "; or set train.memory_check = false if the estimate is wrong");
}

// The run's largest need: its config, or with data.phases the phase whose sequence length and
// batch need the most (context extension: the 32k phase, not the 4k start).
Config largest_phase(const Config& cfg, int workers_per_island) {
  Config largest = cfg;
  double most = -1;
  for (const DataPhase& p : cfg.data.phases) {
    const Config in = config_in_phase(cfg, p);
    const MemoryEstimate e = estimate_memory(in, workers_per_island);
    if (std::max(e.validator_host, e.device) > most) largest = in, most = std::max(e.validator_host, e.device);
  }
  return largest;
}

}  // namespace

void check_memory_fits(const Config& run_cfg, const MemoryCheckOptions& opts) {
  if (!run_cfg.train.memory_check) return;
  const Config cfg = largest_phase(run_cfg, opts.workers_per_island);
  const MemoryEstimate e = estimate_memory(cfg, opts.workers_per_island);
  const AvailableMemory host = available_host_memory();
  // One of the processes may be the worker that validates.
  const double need = e.host * (opts.processes - 1) + e.validator_host;
  if (host.bytes > 0 && need > host.bytes) too_large(cfg, e, need, "host memory", opts.processes, host);
  double free_bytes = 0, total_bytes = 0;
  if (e.device > 0 && cuda_device_memory(opts.device_index, &free_bytes, &total_bytes) && e.device > free_bytes)
    too_large(cfg, e, e.device, "GPU memory", 1, {free_bytes, "free on the GPU of " + bytes_text(total_bytes)});
}

}  // namespace atl
