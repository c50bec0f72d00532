#include "atoll/model/prefill_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "atoll/backend/cpu/gemm.h"
#include "atoll/core/check.h"

namespace atl {
namespace {

constexpr int kTile = 64;   // query rows per tile, as the training kernels'
constexpr int kKeys = 512;  // keys per product: a [64, 512] score tile per thread

// One tile of one head against its visible keys, chunk by chunk: s = scale Q Kᵀ, then the online
// softmax folds each chunk into the running max m and sum l of each row, rescaling the
// unnormalised output o before o += exp(s - m) V. Row i sees `visible(i)` cache rows.
template <typename T, class Visible>
void attend_tile(T* o, T* m, T* l, T* s, const T* q, const T* k, const T* v, int rows, int HD, size_t qd, size_t kvd,
                 Visible visible) {
  const T scale = T(1.0 / std::sqrt(double(HD)));
  const int last = visible(rows - 1);  // the widest row: visibility grows with the position
  for (int j0 = 0; j0 < last; j0 += kKeys) {
    const int nk = std::min(kKeys, last - j0);
    gemm<T>(false, true, rows, nk, HD, scale, q, int(qd), k + size_t(j0) * kvd, int(kvd), T(0), s, nk);
    for (int r = 0; r < rows; ++r) {
      T* row = s + size_t(r) * nk;
      const int valid = std::clamp(visible(r) - j0, 0, nk);
      if (valid == 0) {
        std::fill(row, row + nk, T(0));
        continue;
      }
      T mx = -std::numeric_limits<T>::infinity();
      for (int j = 0; j < valid; ++j) mx = std::max(mx, row[j]);
      const T m_new = std::max(m[r], mx);
      const T corr = std::exp(m[r] - m_new);  // 0 while m is -inf
      T sum = 0;
      for (int j = 0; j < valid; ++j) sum += (row[j] = std::exp(row[j] - m_new));
      std::fill(row + valid, row + nk, T(0));
      l[r] = l[r] * corr + sum, m[r] = m_new;
      for (int e = 0; e < HD; ++e) o[size_t(r) * qd + e] *= corr;
    }
    gemm<T>(false, false, rows, HD, nk, T(1), s, nk, v + size_t(j0) * kvd, int(kvd), T(1), o, int(qd));
  }
}

// Tree attention's merge of the ranks' partial results: M = max m, L = sum l e^(m-M),
// O = sum o e^(m-M) over the ranks, on every rank. A row whose rank saw no key (l = 0) adds 0.
void merge_ranks(float* out, float* m, float* l, int n, int NH, int HD, Collective& group) {
  std::vector<float> top(m, m + size_t(n) * NH);
  group.allreduce_max(top.data(), top.size());
  for (int h = 0; h < NH; ++h)
    for (int i = 0; i < n; ++i) {
      const size_t at = size_t(h) * n + i;
      const float f = l[at] > 0 ? std::exp(m[at] - top[at]) : 0.0f;
      l[at] *= f;
      float* o = out + (size_t(i) * NH + h) * HD;
      for (int e = 0; e < HD; ++e) o[e] *= f;
    }
  group.allreduce_sum(l, size_t(n) * NH);
  group.allreduce_sum(out, size_t(n) * NH * HD);
}

}  // namespace

template <typename T>
void cache_block(T* k_cache, T* v_cache, const T* k, const T* v, int n, int pos, int KVD, const CacheShard& shard) {
  for (int i = 0; i < n; ++i)
    if (shard.holds(pos + i)) {
      std::copy_n(k + size_t(i) * KVD, KVD, k_cache + size_t(shard.row(pos + i)) * KVD);
      std::copy_n(v + size_t(i) * KVD, KVD, v_cache + size_t(shard.row(pos + i)) * KVD);
    }
}

template <typename T>
void attend_prefix(T* out, const T* q, const T* k_cache, const T* v_cache, int n, int pos, int NH, int NKV, int HD,
                   const CacheShard& shard, Collective* group) {
  ATOLL_CHECK(NKV > 0 && NH % NKV == 0) << NH << " query heads, " << NKV << " key/value heads";
  ATOLL_CHECK(!group || group->size() == shard.P) << "a cache sharded over " << shard.P << " ranks, a group of "
                                                  << group->size();
  const size_t qd = size_t(NH) * HD, kvd = size_t(NKV) * HD;
  const int per_kv = NH / NKV, tiles = (n + kTile - 1) / kTile;
  std::vector<T> m(size_t(NH) * n, -std::numeric_limits<T>::infinity()), l(size_t(NH) * n, T(0));  // [NH, n]
  std::fill(out, out + size_t(n) * qd, T(0));
#pragma omp parallel
  {
    std::vector<T> s(size_t(kTile) * kKeys);
#pragma omp for collapse(2) schedule(dynamic)
    for (int h = 0; h < NH; ++h)
      for (int ti = 0; ti < tiles; ++ti) {
        const int i0 = ti * kTile, rows = std::min(kTile, n - i0);
        const size_t head = size_t(h) * HD, kv_head = size_t(h / per_kv) * HD, at = size_t(h) * n + i0;
        attend_tile(out + size_t(i0) * qd + head, m.data() + at, l.data() + at, s.data(), q + size_t(i0) * qd + head,
                    k_cache + kv_head, v_cache + kv_head, rows, HD, qd, kvd,
                    [&](int r) { return shard.rows(pos + i0 + r + 1); });
      }
  }
  if (group) {
    if constexpr (std::is_same_v<T, float>)
      merge_ranks(out, m.data(), l.data(), n, NH, HD, *group);
    else
      ATOLL_CHECK(false) << "tree attention decodes in fp32";
  }
  // Every query sees its own key on some rank, so l > 0 after the merge.
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < NH; ++h) {
      T* o = out + size_t(i) * qd + size_t(h) * HD;
      const T inv = T(1) / l[size_t(h) * n + i];
      for (int e = 0; e < HD; ++e) o[e] *= inv;
    }
}

template void cache_block<float>(float*, float*, const float*, const float*, int, int, int, const CacheShard&);
template void cache_block<double>(double*, double*, const double*, const double*, int, int, int, const CacheShard&);
template void attend_prefix<float>(float*, const float*, const float*, const float*, int, int, int, int, int,
                                   const CacheShard&, Collective*);
template void attend_prefix<double>(double*, const double*, const double*, const double*, int, int, int, int, int,
                                    const CacheShard&, Collective*);

}  // namespace atl
