// A prepared dataset's meta.json as a run reads it (train/dataset.h): a field of the wrong type
// or range is a DataError naming the file and the field, for one dataset and for a mixture.
#include <gtest/gtest.h>

#include "atoll/core/errors.h"
#include "atoll/data/shard.h"
#include "atoll/train/dataset.h"
#include "data/temp_dir.h"

namespace atl {
namespace {

std::string data_error(const Config& cfg) {
  try {
    resolve_dataset(cfg);
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

TEST(DatasetMeta, FieldsOfTheWrongTypeAreNamed) {
  testing::TempDir tmp;
  for (const char* d : {"a", "b"}) {
    std::filesystem::create_directories(tmp / d);
    write_shard(tmp / (std::string(d) + "/train_000000.bin"), std::vector<int32_t>{1, 2, 3});
  }
  testing::write_file(tmp / "b/meta.json", R"({"vocab_size": 64, "tokenizer_fingerprint": "f"})");
  Config one;
  one.model.vocab_size = 64;
  one.data.dir = tmp / "a";
  Config mix = one;
  mix.data.dir.clear();
  mix.data.mix = {{.dir = tmp / "a", .weight = 1.0}, {.dir = tmp / "b", .weight = 1.0}};
  struct Case {
    std::string meta, field;
  };
  for (const Case& c :
       std::vector<Case>{{R"({"vocab_size": "64"})", "vocab_size"},
                         {R"({"vocab_size": -3})", "vocab_size"},
                         {R"({"vocab_size": 4294967360})", "vocab_size"},
                         {R"({"vocab_size": 64, "tokenizer_fingerprint": 7})", "tokenizer_fingerprint"}}) {
    testing::write_file(tmp / "a/meta.json", c.meta);
    for (const Config* cfg : {&one, &mix}) {
      const std::string e = data_error(*cfg);
      if (cfg == &one && c.field == "tokenizer_fingerprint") continue;  // one dataset does not read it
      EXPECT_NE(e.find("meta.json: " + c.field), std::string::npos) << c.meta << "\n  gave: " << e;
    }
  }
}

}  // namespace
}  // namespace atl
