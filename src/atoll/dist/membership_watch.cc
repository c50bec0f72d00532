// An observer's read of a run's membership (membership.h read_membership): the keys are the ones
// Membership writes ("atoll/<run>/members/hb/I.R", ".../epoch", ".../view/e<E>").
#include <string>

#include "atoll/dist/membership.h"

namespace atl {

MembershipSnapshot read_membership(Store& store, int islands, int workers_per_island) {
  const std::string members = store.run_prefix() + "/members/";
  MembershipSnapshot s;
  for (int i = 0; i < islands; ++i)
    for (int r = 0; r < workers_per_island; ++r)
      s.heartbeats.push_back(store.get_expiring(members + "hb/" + Membership::worker_name(i, r)));
  if (const std::optional<std::string> epoch = store.get(members + "epoch"))
    if (const std::optional<std::string> view = store.get(members + "view/e" + std::to_string(parse_epoch(*epoch))))
      s.view = View::from_json(*view);
  return s;
}

}  // namespace atl
