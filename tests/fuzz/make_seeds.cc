// Writes the seed corpora of tests/fuzz/corpus/<target>/ with atoll's own writers (run by hand
// after a format changes: build-asan/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus; scripts/
// fuzz.sh says how). Each seed is a small valid input, so the fuzzers start deep in each parser.
#include <unistd.h>
#include <zstd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/ckpt/export_hf.h"
#include "atoll/ckpt/file_io.h"
#include "atoll/ckpt/safetensors.h"
#include "atoll/data/loader.h"
#include "atoll/data/shard.h"
#include "atoll/dist/codec.h"
#include "atoll/dist/membership.h"
#include "atoll/dist/ring_message.h"
#include "atoll/train/state_transfer.h"
#include "fuzz/tiny_model.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path out_root;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(out_root / target);
  std::ofstream(out_root / target / name, std::ios::binary | std::ios::trunc) << bytes;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void safetensors_seeds(const fs::path& tmp) {
  const std::vector<float> f = {1, -2, 3.5f, 0, 1e-30f, -0.0f};
  const std::vector<uint16_t> h = {0x3f80, 0xbf80, 0x7fc0};
  const std::vector<int32_t> i = {7, -7};
  atl::write_safetensors((tmp / "a").string(),
                         {{"param/w", "F32", {2, 3}, f.data(), 24},
                          {"bf", "BF16", {3}, h.data(), 6},
                          {"ints", "I32", {2, 1}, i.data(), 8},
                          {"empty", "F32", {0, 4}, nullptr, 0}},
                         {.metadata = {{"format", "pt"}}, .fsync = false});
  put("safetensors", "tensors", read_all(tmp / "a"));
  atl::write_safetensors((tmp / "b").string(), {}, {.metadata = {}, .fsync = false});
  put("safetensors", "none", read_all(tmp / "b"));
}

// The manifest_fuzz fixture's checkpoint, written the same way.
void manifest_seeds(const fs::path& tmp) {
  atl::Config cfg;
  cfg.model = atl::fuzz::tiny_model();
  const atl::ParamLayout layout = atl::ParamLayout::build(cfg.model);
  std::vector<float> param(layout.total(), 0.5f);
  const std::string dir = atl::save_checkpoint({.run_dir = (tmp / "run").string(), .step = 1}, cfg, layout,
                                               {{"param", param.data()}}, {{"step", 1}});
  put("manifest", "manifest.json", read_all(fs::path(dir) / "manifest.json"));
  put("manifest", "latest", "step-00000001\n");
}

void shard_seeds(const fs::path& tmp) {
  atl::write_shard((tmp / "s1").string(), std::vector<int32_t>{1, 2, 65535, 0});
  put("shard", "u16", read_all(tmp / "s1"));
  atl::write_shard((tmp / "s2").string(), std::vector<int32_t>{70000, 3}, atl::kShardVersionU32);
  put("shard", "u32", read_all(tmp / "s2"));
  atl::write_shard((tmp / "s3").string(), std::vector<int32_t>{});
  put("shard", "empty", read_all(tmp / "s3"));
}

void meta_seeds() {
  put("meta", "meta.json",
      json{{"format", "atoll-data-2"},
           {"vocab_size", 64},
           {"tokenizer_fingerprint", "abc"},
           {"train_shards", {"train_000000.bin"}},
           {"val_shards", json::array()},
           {"shard_version", 1},
           {"manifest",
            {{"train", {{{"name", "train_000000.bin"}, {"tokens", 9}, {"xxh3", "0000000000000000"}}}},
             {"val", json::array()}}}}
          .dump(2));
}

void config_seeds() {
  put("config", "defaults.toml", atl::config_to_toml(atl::Config{}));
  put("config", "small.toml",
      "[model]\ndim = 64\nn_layers = 2\n[train]\nsteps = 10\nbatch_size = 2\n[optim]\nname = \"muon\"\n"
      "[data]\nmix = [{dir = \"a\", weight = 2.0}, {dir = \"b\", weight = 1.0}]\n"
      "\n%%\ntrain.steps=5\ndiloco.codec=int4\ndata.input=[\"x.txt\", \"y\"]\noptim.lr=3e-4");
}

void codec_seeds() {
  std::vector<float> x(300);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i)) * (i % 7 == 0 ? 100.0f : 1.0f);
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  for (atl::Codec c : {atl::Codec::kFp32, atl::Codec::kBf16, atl::Codec::kInt8, atl::Codec::kInt4})
    for (bool compress : {false, true}) {
      const size_t n = c == atl::Codec::kFp32 ? 20 : x.size();
      const size_t enc = atl::encoded_bytes(c, n);
      std::vector<uint8_t> codec_bytes(enc), msg(atl::kRingHeaderBytes + std::max(enc, ZSTD_compressBound(enc)));
      atl::encode(c, x.data(), n, codec_bytes.data());
      size_t len = enc;
      if (compress) {
        len = atl::wrap_ring_message(cctx, codec_bytes.data(), enc, msg.data(), msg.size());
      } else {
        std::memcpy(msg.data(), codec_bytes.data(), enc);
      }
      std::string seed = {char(int(c) | (compress ? 4 : 0)), char(n & 0xff), char(n >> 8)};
      seed.append(reinterpret_cast<const char*>(msg.data()), len);
      put("codec", std::string(atl::codec_name(c)) + (compress ? "-zstd" : ""), seed);
    }
  ZSTD_freeCCtx(cctx);
}

void membership_seeds() {
  atl::View v{.epoch = 3, .islands = {0, 1, 3}, .joining = {3}, .tokens = {{"0.0", "host:1:ab"}, {"3.0", "host:2:cd"}}};
  put("membership", "view", v.to_json());
  put("membership", "decision", json{{"commit", true}, {"next", json::parse(v.to_json())}}.dump());
  put("membership", "abort", json{{"commit", false}, {"why", "worker 1.0 failed"}}.dump());
  put("membership", "round", "[0,1,3]");
  put("membership", "epoch", "12");
}

void state_transfer_seeds() {
  const atl::Config cfg;
  json manifest = json::object();
  for (const atl::StateEntry& e : atl::state_registry(cfg, true, nullptr)) {
    if (e.type == atl::StateType::kTensor) manifest[e.name] = {{"hash", "0123456789abcdef"}};
  }
  manifest["step"] = {{"value", 40}};
  manifest["tokens"] = {{"value", 40960}};
  manifest["optimizer_step"] = {{"value", 40}};
  manifest["fragment_outer_steps"] = {{"value", {4}}};
  put("state_transfer", "manifest", manifest.dump());
  put("state_transfer", "refusals", json{"param", "diloco_theta"}.dump());
  atl::Cursor c{.epoch = 1,
                .position = 5,
                .seq_len = 64,
                .n_windows = 100,
                .seed = 7,
                .shuffle = true,
                .worker = 1,
                .n_workers = 2};
  put("state_transfer", "record", json{{"loaders", c}}.dump());
  put("state_transfer", "record-mix",
      json{{"loaders", {{"phase", 0}, {"sources", {{{"dir", "a"}, {"picks", 3}, {"cursor", c}}}}}}}.dump());
}

// hf_folder_fuzz.cc's inputs: a first byte (0 config.json, 1 the index, 2 atoll-export.json),
// then the file as an export writes it (the index as transformers writes one).
void hf_folder_seeds(const fs::path& tmp) {
  const atl::ModelConfig m = atl::fuzz::tiny_model();
  const atl::ParamLayout layout = atl::ParamLayout::build(m);
  const std::vector<float> params(layout.total(), 0.25f);
  const fs::path dir = tmp / "hf";
  atl::export_hf(dir.string(), m, layout, params.data());
  put("hf_folder", "config", std::string(1, '\0') + read_all(dir / "config.json"));
  json map = json::object();
  const atl::SafetensorsReader weights = atl::SafetensorsReader::open((dir / "model.safetensors").string());
  for (const auto& t : weights.header().tensors) map[t.name] = "model.safetensors";
  put("hf_folder", "index", std::string(1, '\1') + json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump(2));
  put("hf_folder", "export-record", std::string(1, '\2') + read_all(dir / "atoll-export.json"));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_seeds OUT_DIR (tests/fuzz/corpus)\n";
    return 2;
  }
  out_root = argv[1];
  const fs::path tmp = fs::temp_directory_path() / ("atoll-seeds-" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  safetensors_seeds(tmp);
  manifest_seeds(tmp);
  shard_seeds(tmp);
  meta_seeds();
  config_seeds();
  codec_seeds();
  membership_seeds();
  state_transfer_seeds();
  hf_folder_seeds(tmp);
  fs::remove_all(tmp);
  return 0;
}
