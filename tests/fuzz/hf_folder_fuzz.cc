// A Hugging Face folder as `--init-from` reads it (ckpt/import_hf.h), and an export folder's
// atoll-export.json as the next export reads it (ckpt/export_hf.h): one file of a valid tiny
// Mixtral export replaced by any bytes, the first byte picking which:
//   0: config.json, then read_hf_source and import_hf_weights' checks (nothing converted);
//   1: model.safetensors.index.json beside the single file (the index then names the shards);
//   2: atoll-export.json, then an export into the folder (what it may replace).
#include <filesystem>
#include <fstream>
#include <vector>

#include "atoll/ckpt/export_hf.h"
#include "atoll/ckpt/import_hf.h"
#include "atoll/model/layout.h"
#include "fuzz/fuzz_target.h"
#include "fuzz/tiny_model.h"

namespace {

namespace fs = std::filesystem;

constexpr const char* kTokenizer = "a SentencePiece model is not parsed by the import";

struct Fixture {
  std::string dir;
  atl::ModelConfig model = atl::fuzz::tiny_model();
  atl::ParamLayout layout = atl::ParamLayout::build(model);
  std::vector<float> params = std::vector<float>(layout.total(), 0.25f);
  std::string config_json;
  Fixture() {
    dir = atl::fuzz::scratch_dir() + "/hf";
    atl::export_hf(dir, model, layout, params.data());
    std::ifstream in(dir + "/config.json");
    config_json.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // The folder as the export wrote it, before each input.
  void reset() {
    std::ofstream(dir + "/config.json", std::ios::trunc) << config_json;
    std::error_code ec;
    fs::remove(dir + "/model.safetensors.index.json", ec);
    if (!fs::exists(dir + "/model.safetensors")) {
      fs::remove_all(dir, ec);
      atl::export_hf(dir, model, layout, params.data());
    }
    std::ofstream(dir + "/tokenizer.model", std::ios::trunc) << kTokenizer;
  }
};

}  // namespace

ATOLL_FUZZ_TARGET(hf_folder) {
  static Fixture f;
  if (size == 0) return 0;
  f.reset();
  const std::string_view body = atl::fuzz::as_text(data + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
    case 1: {
      const char* name = data[0] % 3 == 0 ? "/config.json" : "/model.safetensors.index.json";
      std::ofstream(f.dir + name, std::ios::trunc) << body;
      atl::fuzz::fuzz_reject([&] {
        const atl::HfSource src = atl::read_hf_source(f.dir, atl::ModelConfig{});
        atl::import_hf_weights(src, nullptr);
      });
      break;
    }
    default:
      std::ofstream(f.dir + "/atoll-export.json", std::ios::trunc) << body;
      atl::fuzz::fuzz_reject([&] { atl::export_hf(f.dir, f.model, f.layout, f.params.data()); });
  }
  return 0;
}
