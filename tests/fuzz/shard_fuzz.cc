// A token shard in llm.c's .bin format (data/shard.h) over any bytes: magic, version, token
// count against the file size, and every token of an accepted shard.
#include <vector>

#include "atoll/data/shard.h"
#include "fuzz/fuzz_target.h"

ATOLL_FUZZ_TARGET(shard) {
  const std::string path = atl::fuzz::scratch_file("train_000000.bin", data, size);
  atl::fuzz::fuzz_reject([&] {
    const atl::ShardView view(path);
    std::vector<int32_t> tokens(static_cast<size_t>(view.size()));
    view.read(0, view.size(), tokens.data());
    view.max_token();
    for (int64_t i = 0; i < view.size(); ++i)
      if (view.token(i) != tokens[i]) __builtin_trap();
  });
  atl::fuzz::fuzz_reject([&] { atl::read_shard(path); });
  return 0;
}
