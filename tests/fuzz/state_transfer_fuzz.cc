// The messages of a state transfer to a joiner (train/state_transfer.h) over any bytes: the
// source's manifest, a worker's refusals and a worker record from the store, each checked
// against the entries of a DiLoCo run (their values through the entries' own checks: the data
// cursor, step counts, fragments' outer steps).
#include "atoll/train/state_transfer.h"
#include "fuzz/fuzz_target.h"

ATOLL_FUZZ_TARGET(state_transfer) {
  static const atl::Config cfg;
  static const std::vector<atl::StateEntry> entries = atl::state_registry(cfg, /*diloco=*/true, nullptr);
  const std::string text(atl::fuzz::as_text(data, size));
  atl::fuzz::fuzz_reject([&] { atl::parse_transfer_manifest(text, entries); });
  atl::fuzz::fuzz_reject([&] { atl::parse_refusals(text, entries); });
  atl::fuzz::fuzz_reject([&] { atl::parse_worker_record(text, entries); });
  atl::fuzz::fuzz_reject([&] { atl::record_value(text, "loaders"); });
  return 0;
}
