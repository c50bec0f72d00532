#include "atoll/model/chunk_boundary.h"

#include <algorithm>
#include <memory>

namespace atl {
namespace {

// Rank r's two neighbour messages in flight at once: right_out to r+1 while right_in comes from
// it, left_out to r-1 while left_in comes from it. Rank P-1's right neighbour holds its own
// second chunk (right_in = right_out); rank 0 has no left neighbour (left_in untouched).
template <typename T>
void swap_with_neighbours(T* right_in, const T* right_out, T* left_in, const T* left_out, size_t n, Collective& group) {
  const int r = group.rank(), P = group.size();
  const size_t bytes = n * sizeof(T);
  std::unique_ptr<Collective::Pending> right, left;
  if (r + 1 < P)
    right = group.exchange(right_out, bytes, r + 1, right_in, bytes, r + 1);
  else
    std::copy(right_out, right_out + n, right_in);
  if (r > 0) left = group.exchange(left_out, bytes, r - 1, left_in, bytes, r - 1);
  if (right) right->wait();
  if (left) left->wait();
}

}  // namespace

template <typename T>
void chunk_tails_forward(T* head0, T* head1, const T* tail0, const T* tail1, size_t n, Collective& group) {
  swap_with_neighbours(head1, tail0, head0, tail1, n, group);
}

template <typename T>
void chunk_heads_backward(T* dtail0, T* dtail1, const T* dhead0, const T* dhead1, size_t n, Collective& group) {
  if (group.rank() == 0) std::fill(dtail1, dtail1 + n, T(0));
  swap_with_neighbours(dtail0, dhead1, dtail1, dhead0, n, group);
}

template void chunk_tails_forward<float>(float*, float*, const float*, const float*, size_t, Collective&);
template void chunk_tails_forward<double>(double*, double*, const double*, const double*, size_t, Collective&);
template void chunk_heads_backward<float>(float*, float*, const float*, const float*, size_t, Collective&);
template void chunk_heads_backward<double>(double*, double*, const double*, const double*, size_t, Collective&);

}  // namespace atl
