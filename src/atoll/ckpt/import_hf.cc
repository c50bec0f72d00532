#include "atoll/ckpt/import_hf.h"

#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "atoll/ckpt/export_zaya.h"
#include "atoll/ckpt/file_io.h"
#include "atoll/ckpt/safetensors.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/model/layout.h"

namespace fs = std::filesystem;

namespace atl {

HfSource read_hf_config(const std::string& dir, const ModelConfig& base, HfSource src);  // hf_config.cc

namespace {

constexpr const char* kIndex = "model.safetensors.index.json";
constexpr const char* kSingle = "model.safetensors";

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

// `name` (from the index) as a file inside `dir`: a plain name, no "..", not absolute, and not a
// symbolic link whose target lies outside the folder.
std::string inside(const fs::path& dir, const std::string& name, const std::string& index) {
  const fs::path p(name);
  const auto refuse = [&](const std::string& why) {
    throw ConfigError(index + " names weight file \"" + name + "\", " + why +
                      "; an import reads only files inside its folder (fix: copy the shards into " + dir.string() +
                      ", e.g. cp -L, and name them by their file names)");
  };
  if (name.empty() || p.is_absolute() || p.has_parent_path() || name == "." || name == "..")
    refuse("which is not a file name inside the folder");
  std::error_code ec;
  const fs::path full = dir / p;
  if (!fs::exists(full, ec))
    throw ConfigError(index + " names weight file " + full.string() +
                      ", which is missing (fix: download every shard the index names)");
  const fs::path real = fs::canonical(full, ec), home = fs::canonical(dir, ec);
  if (ec || real.parent_path() != home) refuse("a symbolic link to " + real.string() + ", outside the folder");
  return full.string();
}

float bf16_to_f32(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t u;
  if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13);  // inf, nan
  else if (exp != 0) u = sign | ((exp + 112) << 23) | (man << 13);
  else if (man == 0) u = sign;
  else {  // subnormal: normalise
    int e = -1;
    uint32_t m = man;
    do { m <<= 1, ++e; } while (!(m & 0x400));
    u = sign | uint32_t(112 - e) << 23 | ((m & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void convert(const std::string& dtype, const std::byte* src, size_t n, float* dst) {
  if (dtype == "F32") {
    std::memcpy(dst, src, n * 4);
    return;
  }
  // One loop per dtype (the choice out of the loop: the bf16 one is a shift the compiler vectorises).
  uint16_t h;
  if (dtype == "BF16")
    for (size_t i = 0; i < n; ++i) std::memcpy(&h, src + 2 * i, 2), dst[i] = bf16_to_f32(h);
  else
    for (size_t i = 0; i < n; ++i) std::memcpy(&h, src + 2 * i, 2), dst[i] = f16_to_f32(h);
}

size_t data_bytes(const SafetensorsHeader& h) { return h.tensors.empty() ? 0 : h.tensors.back().end; }

// A weight file's header, checked against the file's length, without reading its data.
SafetensorsHeader read_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (!in || ec) throw IoError("cannot read " + path + (ec ? ": " + ec.message() : std::string()));
  std::vector<std::byte> head(8);
  if (size < 8 || !in.read(reinterpret_cast<char*>(head.data()), 8))
    throw CorruptCheckpoint("corrupt safetensors file " + path + ": shorter than its 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(std::to_integer<unsigned char>(head[i])) << (8 * i);
  if (n <= size - 8) {  // else parse_safetensors_header refuses the length
    head.resize(8 + n);
    if (!in.read(reinterpret_cast<char*>(head.data()) + 8, std::streamsize(n))) throw IoError("cannot read " + path);
  }
  return parse_safetensors_header(head, size, path);
}

// The index's weight_map must say where each tensor is: a tensor it puts in another file than the
// one holding it is a folder put together from two downloads.
void check_index(const HfSource& src, const std::map<std::string, size_t>& where) {
  const fs::path index = fs::path(src.dir) / kIndex;
  std::error_code ec;
  if (src.weight_files.size() == 1 && !fs::exists(index, ec)) return;
  // read_hf_source checked the index; a file changed since is refused, not trusted.
  const nlohmann::json j = nlohmann::json::parse(read_text_file(index.string()), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw CorruptCheckpoint(index.string() + " changed while it was read (fix: import again once it is complete)");
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string())
      throw CorruptCheckpoint(index.string() + " changed while it was read (fix: import again once it is complete)");
    const auto it = where.find(tensor);
    if (it == where.end())
      throw CorruptCheckpoint(index.string() + " puts tensor '" + tensor + "' in " + file.get<std::string>() +
                              ", which does not hold it (fix: re-download the model)");
    if (fs::path(src.weight_files[it->second]).filename() != file.get<std::string>())
      throw CorruptCheckpoint(index.string() + " puts tensor '" + tensor + "' in " + file.get<std::string>() + ", but " +
                              src.weight_files[it->second] + " holds it (fix: re-download the model)");
  }
}


// Where the bytes [begin, end) of a weight file go: converted from `t`'s dtype into dst on.
struct Target {
  size_t begin, end;
  const TensorInFile* t;
  float* dst;
};

constexpr size_t kChunk = size_t(64) << 20;

// Reads `path` once, front to back, in chunks of about kChunk bytes (each chunk ends on an element
// boundary of the tensor it ends in, so no element is split), converting each target's bytes as
// they pass. Returns the xxh3 of the file's bytes; CorruptCheckpoint when the file is not the
// length its header gave.
uint64_t stream_file(const std::string& path, const SafetensorsHeader& h, const std::vector<Target>& targets) {
  const size_t total = h.data_start + data_bytes(h);
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  if (!in) throw IoError("cannot read " + path);
  if (fs::file_size(path, ec) != total || ec)
    throw CorruptCheckpoint(path + " changed while it was read (fix: import again once it is complete)");
  XXH3_state_t* state = XXH3_createState();
  ATOLL_CHECK(state != nullptr);
  XXH3_64bits_reset(state);
  std::vector<std::byte> buf;
  for (size_t at = 0; at < total;) {
    size_t end = std::min(total, at + kChunk);
    for (const TensorInFile& t : h.tensors)  // round up to the element grid of the tensor `end` falls in
      if (t.file_offset < end && end < t.file_offset + t.bytes()) {
        const size_t elem = safetensors_dtype_size(t.dtype), into = end - t.file_offset;
        end = t.file_offset + (into + elem - 1) / elem * elem;
      }
    buf.resize(end - at);
    if (!in.read(reinterpret_cast<char*>(buf.data()), std::streamsize(buf.size()))) {
      XXH3_freeState(state);
      throw CorruptCheckpoint(path + " changed while it was read (fix: import again once it is complete)");
    }
    XXH3_64bits_update(state, buf.data(), buf.size());
    for (const Target& g : targets) {
      const size_t a = std::max(g.begin, at), b = std::min(g.end, end);
      if (a >= b) continue;
      const size_t elem = safetensors_dtype_size(g.t->dtype);
      convert(g.t->dtype, buf.data() + (a - at), (b - a) / elem, g.dst + (a - g.begin) / elem);
    }
    at = end;
  }
  const uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return sum;
}
}  // namespace

HfSource read_hf_source(const std::string& dir, const ModelConfig& base) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw ConfigError("--init-from " + dir + " is not a folder (fix: pass a Hugging Face model folder)");
  HfSource src;
  src.dir = dir;
  src = read_hf_config(dir, base, src);
  const fs::path d(dir);
  if (fs::exists(d / kIndex, ec)) {
    const std::string index = (d / kIndex).string();
    nlohmann::json j = nlohmann::json::parse(read_text_file(index), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw ConfigError(index + " has no \"weight_map\" object (fix: rewrite it, or pass a folder with " + kSingle + ")");
    std::set<std::string> files;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw ConfigError(index + ": weight_map." + tensor + " is not a file name");
      files.insert(file.get<std::string>());
    }
    for (const std::string& f : files) src.weight_files.push_back(inside(d, f, index));
  } else if (fs::exists(d / kSingle, ec)) {
    src.weight_files.push_back(inside(d, kSingle, (d / "config.json").string()));
  } else {
    throw ConfigError(dir + " has neither " + kSingle + " nor " + kIndex + " (fix: download the model's weights)");
  }
  if (!fs::exists(d / "tokenizer.model", ec)) {
    if (fs::exists(d / "tokenizer.json", ec))
      throw ConfigError(dir + " has only tokenizer.json (a Hugging Face tokenizers file); atoll reads SentencePiece "
                        "tokenizer.model only (fix: put the model's SentencePiece tokenizer.model in the folder; models "
                        "whose tokenizer is BPE in tokenizer.json only cannot be imported yet)");
    throw ConfigError(dir + " has no tokenizer.model (fix: put the model's SentencePiece tokenizer.model in the folder)");
  }
  src.tokenizer_path = inside(d, "tokenizer.model", dir);
  // A folder holding fused experts (transformers v5) names them; otherwise one matrix per expert.
  if (src.architecture == "Qwen3MoeForCausalLM" || src.architecture == "OlmoeForCausalLM" ||
      src.architecture == "Qwen2MoeForCausalLM")
    src.layout = HfExpertLayout::kPerExpertMlp;
  else if (src.architecture == "ZayaForCausalLM")
    src.layout = HfExpertLayout::kFused;
  else if (src.architecture != "MixtralForCausalLM")
    src.layout = HfExpertLayout::kDense;
  return src;
}

void upcycle_hf_source(HfSource& src, int experts, int top_k) {
  if (src.layout != HfExpertLayout::kDense)
    throw ConfigError("--init-from " + src.dir + " is a " + src.architecture + " with " +
                      std::to_string(src.model.n_experts) + " experts of its own; upcycling (model.n_experts " +
                      std::to_string(experts) + ") starts from a dense model (fix: leave out --set model.n_experts)");
  if (top_k < 1 || top_k > experts)
    throw ConfigError("upcycling " + src.dir + " to model.n_experts = " + std::to_string(experts) + " with model.top_k = " +
                      std::to_string(top_k) + " (fix: model.top_k between 1 and model.n_experts)");
  src.model.n_experts = experts, src.model.top_k = top_k, src.model.router_renormalize = true;
}

namespace {

// An upcycled import (upcycle_hf_source): the dense model read as it is, then every expert of each
// layer a copy of its MLP; the router is zeroed by the caller.
nlohmann::json import_upcycled(const HfSource& src, float* params) {
  HfSource dense = src;
  dense.model.n_experts = 1, dense.model.top_k = 1;
  const ParamLayout one = ParamLayout::build(dense.model), layout = ParamLayout::build(src.model);
  std::vector<float> from(params ? one.total() : 0);
  nlohmann::json ev = import_hf_weights(dense, params ? from.data() : nullptr);
  ev["upcycled_experts"] = src.model.n_experts;
  ev["upcycled_top_k"] = src.model.top_k;
  if (!params) return ev;
  for (const ParamEntry& e : layout.entries()) {
    const ParamEntry& d = one.at(e.name);
    for (size_t at = 0; at < e.numel; at += d.numel)  // an expert stack [E, R, W] takes E copies of [1, R, W]
      std::copy(from.begin() + d.offset, from.begin() + d.offset + d.numel, params + e.offset + at);
  }
  return ev;
}

}  // namespace

nlohmann::json import_hf_weights(const HfSource& src, float* params) {
  if (src.layout == HfExpertLayout::kDense && src.model.n_experts > 1) {
    nlohmann::json ev = import_upcycled(src, params);
    const ParamLayout layout = ParamLayout::build(src.model);
    if (params)  // zero router: every expert equally likely
      for (const auto& e : layout.entries())
        if (e.name.ends_with("moe.router")) std::fill(params + e.offset, params + e.offset + e.numel, 0.0f);
    return ev;
  }
  const ParamLayout layout = ParamLayout::build(src.model);
  // Pass 1, the headers only (each checked against its file's length): which file holds what.
  std::vector<SafetensorsHeader> headers;
  std::map<std::string, size_t> where;  // tensor -> index into src.weight_files
  for (size_t i = 0; i < src.weight_files.size(); ++i) {
    const std::string& f = src.weight_files[i];
    headers.push_back(read_header(f));
    for (const auto& t : headers.back().tensors) {
      if (where.count(t.name))
        throw CorruptCheckpoint("tensor '" + t.name + "' is in both " + src.weight_files[where[t.name]] + " and " + f +
                                " (fix: re-download the model)");
      where[t.name] = i;
    }
  }
  check_index(src, where);
  HfExpertLayout lay = src.layout;
  if (lay != HfExpertLayout::kDense && where.count("model.layers.0.mlp.experts.gate_up_proj")) lay = HfExpertLayout::kFused;
  std::vector<std::vector<HfPiece>> by_file(src.weight_files.size());
  std::set<std::string> mapped;
  const bool zaya = src.architecture == "ZayaForCausalLM";
  if (zaya) lay = HfExpertLayout::kFused;
  for (const HfPiece& p : zaya ? hf_zaya_pieces(layout) : hf_mixtral_pieces(layout, lay)) {
    const auto it = where.find(p.name);
    if (it == where.end())
      throw CorruptCheckpoint("tensor '" + p.name + "' of " + src.architecture + " (" + expert_layout_name(lay) +
                              " layout) is in none of the weight files of " + src.dir + " (fix: download every shard)");
    const std::string& f = src.weight_files[it->second];
    const TensorInFile& t = *headers[it->second].find(p.name);
    if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
      throw CorruptCheckpoint(f + ": tensor '" + p.name + "' is " + t.dtype + "; atoll imports F32, BF16, F16");
    if (t.shape != p.shape)
      throw CorruptCheckpoint(f + ": tensor '" + p.name + "' has shape " + shape_string(t.shape) + ", config.json says " +
                              shape_string(p.shape) + " (fix: a config.json matching the weights)");
    by_file[it->second].push_back(p);
    mapped.insert(p.name);
  }
  // Every tensor of the files has a place, but the rotary tables older checkpoints keep and a
  // tied model's copy of its embedding as lm_head (compared below).
  const bool tied_head = src.model.tie_embeddings && where.count("lm_head.weight");
  for (const auto& [name, i] : where)
    if (!mapped.count(name) && !name.ends_with("rotary_emb.inv_freq") && !(tied_head && name == "lm_head.weight"))
      throw CorruptCheckpoint(src.weight_files[i] + ": tensor '" + name + "' has no place in atoll's " + src.architecture +
                              " (fix: a config.json describing this model; atoll refuses rather than drop weights)");
  // Pass 2, one file at a time, read once in order in chunks of about kChunk bytes: each chunk
  // hashed and the parts of pieces it holds converted, so the import holds the fp32 model and one
  // chunk, whatever the size of the files.
  nlohmann::json sums = nlohmann::json::object();
  std::vector<float> head;  // a tied model's stored lm_head
  for (size_t i = 0; i < src.weight_files.size(); ++i) {
    const std::string& f = src.weight_files[i];
    std::vector<Target> targets;
    if (params)
      for (const HfPiece& p : by_file[i]) {
        const TensorInFile& t = *headers[i].find(p.name);
        const size_t width = p.shape.empty() ? 1 : size_t(p.shape.back()), elem = safetensors_dtype_size(t.dtype);
        const size_t begin = t.file_offset + size_t(p.row) * width * elem;
        targets.push_back({begin, begin + size_t(p.rows) * width * elem, &t, params + p.offset});
      }
    if (params && tied_head && where["lm_head.weight"] == i) {
      const TensorInFile& t = *headers[i].find("lm_head.weight");
      head.resize(t.bytes() / safetensors_dtype_size(t.dtype));
      targets.push_back({t.file_offset, t.file_offset + t.bytes(), &t, head.data()});
    }
    sums[fs::path(f).filename().string()] = hex64(stream_file(f, headers[i], targets));
  }
  if (params && tied_head) {
    const ParamEntry* embed = layout.find("embed");
    if (head.size() != embed->numel || !std::equal(head.begin(), head.end(), params + embed->offset))
      throw CorruptCheckpoint(src.weight_files[where["lm_head.weight"]] + ": tensor 'lm_head.weight' differs from "
                              "model.embed_tokens.weight, but config.json ties them (tie_word_embeddings); fix: a "
                              "config.json with tie_word_embeddings = false");
  }
  if (params && lay == HfExpertLayout::kDense)  // one expert: its router weight is 1 whatever the logits
    for (const auto& e : layout.entries())
      if (e.name.ends_with("moe.router")) std::fill(params + e.offset, params + e.offset + e.numel, 0.0f);
  for (const char* f : {"config.json", "tokenizer.model"}) {
    const std::vector<std::byte> all = read_file_bytes((fs::path(src.dir) / f).string());
    sums[f] = hex64(XXH3_64bits(all.data(), all.size()));
  }
  return {{"source", fs::absolute(src.dir).lexically_normal().string()},
          {"architecture", src.architecture},
          {"expert_layout", expert_layout_name(lay)},
          {"xxh3", sums},
          {"tensors", mapped.size()},
          {"config_fields_without_effect", src.ignored}};
}

}  // namespace atl
