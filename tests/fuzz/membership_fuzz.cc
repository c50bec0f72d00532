// The membership records other workers write in the store (dist/membership.h) over any bytes:
// a view, a decision (with the next view), a round's islands and the epoch. A view that parses
// must print and parse back to the same view.
#include "atoll/dist/membership.h"
#include "fuzz/fuzz_target.h"

ATOLL_FUZZ_TARGET(membership) {
  const std::string text(atl::fuzz::as_text(data, size));
  atl::fuzz::fuzz_reject([&] {
    const atl::View v = atl::View::from_json(text);
    const atl::View again = atl::View::from_json(v.to_json());
    if (again.to_json() != v.to_json()) __builtin_trap();
    v.describe();
    v.holders();
  });
  atl::fuzz::fuzz_reject([&] { atl::parse_decision(text); });
  atl::fuzz::fuzz_reject([&] { atl::parse_round(text); });
  atl::fuzz::fuzz_reject([&] { atl::parse_epoch(text); });
  return 0;
}
