// A prepared dataset's meta.json (data/prepare.h writes it) over any bytes, as a run reads it:
// a single dataset (data.dir) and a mixture of two (data.mix), beside a valid shard.
#include <filesystem>
#include <fstream>

#include "atoll/data/shard.h"
#include "atoll/train/dataset.h"
#include "fuzz/fuzz_target.h"

namespace {

struct Fixture {
  std::string a, b;
  Fixture() {
    a = atl::fuzz::scratch_dir() + "/data-a";
    b = atl::fuzz::scratch_dir() + "/data-b";
    const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    for (const std::string& d : {a, b}) {
      std::filesystem::create_directories(d);
      atl::write_shard(d + "/train_000000.bin", tokens);
    }
    std::ofstream(b + "/meta.json") << R"({"vocab_size": 64, "tokenizer_fingerprint": "abc"})";
  }
};

}  // namespace

ATOLL_FUZZ_TARGET(meta) {
  static Fixture f;
  std::ofstream(f.a + "/meta.json", std::ios::trunc) << atl::fuzz::as_text(data, size);
  atl::Config one;
  one.model.vocab_size = 64;
  one.data.dir = f.a;
  atl::fuzz::fuzz_reject([&] { atl::resolve_dataset(one); });
  atl::Config mix = one;
  mix.data.dir.clear();
  mix.data.mix = {{.dir = f.a, .weight = 1.0}, {.dir = f.b, .weight = 1.0}};
  atl::fuzz::fuzz_reject([&] { atl::resolve_dataset(mix); });
  return 0;
}
