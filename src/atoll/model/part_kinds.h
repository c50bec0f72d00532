// The table of part kinds: every attention kind and router kind a config may choose
// (model.attention, model.router and their per-layer lists), once, with what the rest of atoll
// asks of a kind (torchtitan's TrainSpec registry, gemma.cpp's LayerAttentionType):
//   - its name and a line of help (config/ lists the choices from here),
//   - its rows of the layout table and its CPU constructor (model/block.cc builds from here),
//     and whether a CUDA mirror exists (model/device_block.cu holds the GPU constructors by
//     the same names: the GPU code cannot sit in a table the CPU-only build links),
//   - its validation (a reason and a fix, or nothing) and the config keys only it reads,
//   - its costs: multiply-adds per token (model.cc's FLOP count), the bytes one layer keeps for
//     backward and the work buffer it needs for B sequences of T tokens, the scratch every layer
//     of the kind shares, and what decoding keeps (the memory estimate, `atoll bench`),
//   - the tokens of the previous chunk of a sequence it reads (context parallelism: a chunk's
//     first tokens see that many earlier ones through CCA's convolutions and value shift).
// A new kind is one entry here (plus its file pair); nothing else tests for a kind by name.
// tests/model/part_kinds_test.cc checks every entry against the part it builds.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "atoll/model/part.h"

namespace atl {

// What decoding keeps, in bytes (fp32 values): per token of context (keys and values), and per
// sequence whatever its length (CCA's convolution window and delayed value half).
struct KvCacheBytes {
  double per_token = 0, per_sequence = 0;
};

// The sizes a cost is asked for: B sequences of T tokens (T: the tokens one worker holds of
// each sequence), with bf16 products or not.
struct CostShape {
  double B = 1, T = 1;
  bool bf16 = false;
};

template <template <typename> class Part>
struct PartKind {
  template <typename T>
  using Make = std::unique_ptr<Part<T>> (*)(const ModelConfig& m, const ParamLayout& layout, int layer,
                                            const PartSizes& s, PartScratch& scratch);
  std::string_view name;
  std::string_view help;  // one line for the config's help text
  void (*rows)(ParamLayout& layout, const ModelConfig& m, int layer);
  Make<float> make_f32;
  Make<double> make_f64;
  bool gpu;  // a CUDA mirror exists (model/device_block.cu)
  // Empty when layer `layer` may be of this kind under m, else "<reason>; fix: <fix>".
  std::string (*validate)(const ModelConfig& m, int layer);
  std::vector<std::string_view> keys;  // config keys only this kind reads ("model.cca_time0")
  double (*macs_per_token)(const ModelConfig& m);             // forward multiply-adds, one layer
  double (*kept_bytes)(const ModelConfig& m, CostShape s);    // one layer, kept for backward
  double (*work_bytes)(const ModelConfig& m, CostShape s);    // PartContext::work it needs
  double (*shared_bytes)(const ModelConfig& m, CostShape s);  // PartScratch of all layers of the kind
  KvCacheBytes (*decode_cache)(const ModelConfig& m);         // one layer
  int (*boundary_tokens)(const ModelConfig& m);               // of the previous chunk, read
  template <typename T>
  Make<T> make() const {
    if constexpr (std::is_same_v<T, float>) return make_f32;
    else return make_f64;
  }
};

using AttentionKind = PartKind<AttentionPart>;
using RouterKind = PartKind<RouterPart>;

const std::vector<AttentionKind>& attention_kinds();
const std::vector<RouterKind>& router_kinds();

// Layer `layer`'s kinds under m; ConfigError naming the choices for a name not in the table.
const AttentionKind& attention_kind_at(const ModelConfig& m, int layer);
const RouterKind& router_kind_at(const ModelConfig& m, int layer);

// The kinds' names, in table order ({"gqa", "cca"}).
std::vector<std::string> attention_kind_names();
std::vector<std::string> router_kind_names();

// The first reason a layer's kinds refuse the config ("layer 3's attention cca: ..."), or "".
std::string validate_part_kinds(const ModelConfig& m);
// Whether some layer's kind reads `key` (one of the kinds' `keys`).
bool part_kind_reads(const ModelConfig& m, std::string_view key);
// The most tokens of the previous chunk any layer reads (0: chunks are independent but for
// attention itself).
int boundary_tokens(const ModelConfig& m);

}  // namespace atl
