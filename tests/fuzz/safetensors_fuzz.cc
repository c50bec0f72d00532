// The safetensors reader (ckpt/safetensors.h) over any bytes: the header (length, JSON, dtypes,
// shapes, offsets) and the data area it indexes. Checkpoints and exports are read with it.
#include "atoll/ckpt/safetensors.h"
#include "fuzz/fuzz_target.h"

ATOLL_FUZZ_TARGET(safetensors) {
  atl::fuzz::fuzz_reject([&] {
    const auto r = atl::SafetensorsReader::open(atl::fuzz::scratch_file("t.safetensors", data, size));
    // Every tensor the header accepted must lie inside the file: touch each one's bytes.
    std::vector<std::byte> copy;
    for (const atl::TensorInFile& t : r.header().tensors) {
      copy.resize(t.bytes());
      r.copy_to(t.name, t.dtype, t.shape, copy.data());
      const auto v = r.view(t.name);
      if (v.size() != t.bytes()) __builtin_trap();
    }
    r.view("no such tensor");  // an absent name is a CorruptCheckpoint
  });
  return 0;
}
