// The token shards a reader of a dataset reads, checked against what `atoll data prepare` wrote
// of them in the dataset's meta.json ("manifest": per split, each shard's name, token count and
// XXH3-64 of its token bytes; prepare.h), so that damaged data never trains without a word:
//   - at open (cheap: the file list and each shard's header): every shard meta.json lists is
//     there, no other shard of the split is, and each holds the token count meta.json says;
//   - the checksums, which cost reading every byte, on a background thread (shard_verifier.h):
//     the run's readers ask it before each checkpoint commits, eval before it reports.
// Shards that no meta.json lists (llm.c's own, a folder of .bin files made elsewhere) are read
// unchecked, with a warning, once per folder.
#pragma once

#include <string>
#include <vector>

namespace atl {

struct ListedShard {
  std::string path;
  std::string xxh3;  // what meta.json says of its token bytes; "" when no meta.json lists it
};

// The shards of `split` ("train" or "val") that a reader of `path` reads, sorted by name: the
// `<split>_*.bin` files of a folder, or `path` itself when it is a single .bin file (checked
// against its folder's meta.json when that lists it, under either split). Throws DataError
// naming the shard, meta.json and the fix: no shards, a listed shard missing, a shard meta.json
// does not list, a shard whose token count is not meta.json's, a bad name in meta.json.
std::vector<ListedShard> list_shards(const std::string& path, const std::string& split);

// Whether the meta.json of folder `dir` lists shards of `split` (present or not).
bool meta_lists_split(const std::string& dir, const std::string& split);

}  // namespace atl
