#include "atoll/model/cached_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "atoll/backend/cpu/gemm.h"
#include "atoll/core/check.h"

namespace atl {
namespace {

constexpr int kTile = 64;     // prefill: query rows per tile, as the training kernels'
constexpr int kKeys = 512;    // prefill: keys per product, a [64, 512] score tile per thread
constexpr int kSplit = 2048;  // decoding: keys per task and per product (a [G, 2048] tile)

// One tile of one head against its visible keys, chunk by chunk: s = scale Q Kᵀ, then the online
// softmax folds each chunk into the running max m and sum l of each row, rescaling the
// unnormalised output o before o += exp(s - m) V. Row i sees `visible(i)` cache rows; `keys` per
// product (s holds [rows, keys]); q and o rows `qd` apart.
template <typename T, class Visible>
void attend_tile(T* o, T* m, T* l, T* s, const T* q, const T* k, const T* v, int rows, int HD, size_t qd, size_t kvd,
                 int keys, Visible visible) {
  const T scale = T(1.0 / std::sqrt(double(HD)));
  const int last = visible(rows - 1);  // the widest row: visibility grows with the position
  for (int j0 = 0; j0 < last; j0 += keys) {
    const int nk = std::min(keys, last - j0);
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

// Tree attention's merge of a prefill block's partial results over the ranks: M = max m,
// L = sum l e^(m-M), O = sum o e^(m-M), on every rank; two all-reduces (Gloo's rings: the same
// bits everywhere), the second over [l | o] packed. A row whose rank saw no key (l = 0) adds 0.
void merge_ranks(float* out, float* m, float* l, int n, int NH, int HD, Collective& group) {
  const size_t rows = size_t(n) * NH, od = size_t(NH) * HD;
  std::vector<float> top(m, m + rows), sums(rows + rows * HD);
  group.allreduce_max(top.data(), top.size());
  for (int h = 0; h < NH; ++h)
    for (int i = 0; i < n; ++i) {
      const size_t at = size_t(h) * n + i;
      const float f = l[at] > 0 ? std::exp(m[at] - top[at]) : 0.0f;
      sums[at] = l[at] * f;
      const float* o = out + size_t(i) * od + size_t(h) * HD;
      float* so = sums.data() + rows + size_t(i) * od + size_t(h) * HD;
      for (int e = 0; e < HD; ++e) so[e] = o[e] * f;
    }
  group.allreduce_sum(sums.data(), sums.size());
  std::copy_n(sums.data(), rows, l);
  std::copy_n(sums.data() + rows, rows * HD, out);
}

// Folds one partial result (m, l, o[HD]) of a query row into the running (M, L, O): the
// log-sum-exp merge. A part that saw no key (l = 0) adds nothing.
template <typename T>
void fold(T& M, T& L, T* O, T m, T l, const T* o, int HD) {
  if (l == 0) return;
  if (m > M) {  // rescale what is held to the new maximum (nothing held yet: L = 0, O = 0)
    const T f = L > 0 ? std::exp(M - m) : T(0);
    L *= f;
    for (int e = 0; e < HD; ++e) O[e] *= f;
    M = m;
  }
  const T f = std::exp(m - M);
  L += l * f;
  for (int e = 0; e < HD; ++e) O[e] += o[e] * f;
}

// Tree attention's merge of a decoded token's partial results: every rank's (m, l, o) per head
// goes to every other rank at once (P-1 exchanges in flight: rank r sends to r+s and receives
// from r-s, so the whole merge costs one message's latency, not an all-reduce's rounds), and
// each rank folds the P parts in rank order: the same data and order everywhere, so the same
// bits. On return m, l, out hold the merged results.
void merge_token(float* out, float* m, float* l, int NH, int HD, Collective& group) {
  const int P = group.size(), r = group.rank();
  const size_t per = size_t(NH) * (2 + HD), bytes = per * sizeof(float);
  std::vector<float> all(size_t(P) * per);  // [P][m NH | l NH | o NH·HD]
  float* mine = all.data() + size_t(r) * per;
  std::copy_n(m, NH, mine), std::copy_n(l, NH, mine + NH), std::copy_n(out, size_t(NH) * HD, mine + 2 * NH);
  std::vector<std::unique_ptr<Collective::Pending>> moving;
  for (int s = 1; s < P; ++s) {
    const int src = (r - s + P) % P;
    moving.push_back(group.exchange(mine, bytes, (r + s) % P, all.data() + size_t(src) * per, bytes, src));
  }
  for (auto& p : moving) p->wait();
  std::fill(m, m + NH, -std::numeric_limits<float>::infinity());
  std::fill(l, l + NH, 0.0f);
  std::fill(out, out + size_t(NH) * HD, 0.0f);
  for (int k = 0; k < P; ++k) {
    const float* part = all.data() + size_t(k) * per;
    for (int h = 0; h < NH; ++h)
      fold(m[h], l[h], out + size_t(h) * HD, part[h], part[NH + h], part + 2 * size_t(NH) + size_t(h) * HD, HD);
  }
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
                    k_cache + kv_head, v_cache + kv_head, rows, HD, qd, kvd, kKeys,
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

template <typename T>
void attend_token(T* out, const T* q, const T* k_cache, const T* v_cache, int rows, int NH, int NKV, int HD,
                  Collective* group) {
  ATOLL_CHECK(NKV > 0 && NH % NKV == 0) << NH << " query heads, " << NKV << " key/value heads";
  const int G = NH / NKV, splits = (rows + kSplit - 1) / kSplit;
  const size_t kvd = size_t(NKV) * HD, parts = size_t(NKV) * splits * G;
  // Each task's partial result: [NKV, splits, G] rows of (m, l) and o[HD].
  std::vector<T> pm(parts, -std::numeric_limits<T>::infinity()), pl(parts, T(0)), po(parts * HD, T(0));
#pragma omp parallel if (NKV * splits > 1)
  {
    std::vector<T> s(size_t(G) * kSplit);
#pragma omp for collapse(2) schedule(dynamic)
    for (int kh = 0; kh < NKV; ++kh)
      for (int sp = 0; sp < splits; ++sp) {
        const int j0 = sp * kSplit, n = std::min(kSplit, rows - j0);
        const size_t at = (size_t(kh) * splits + sp) * G, head = size_t(kh) * HD;
        attend_tile(po.data() + at * HD, pm.data() + at, pl.data() + at, s.data(), q + head * G,
                    k_cache + size_t(j0) * kvd + head, v_cache + size_t(j0) * kvd + head, G, HD, size_t(HD), kvd,
                    kSplit, [n](int) { return n; });
      }
  }
  // This rank's result per head: its splits folded in order.
  std::vector<T> m(size_t(NH), -std::numeric_limits<T>::infinity()), l(size_t(NH), T(0));
  std::fill(out, out + size_t(NH) * HD, T(0));
  for (int kh = 0; kh < NKV; ++kh)
    for (int g = 0; g < G; ++g) {
      const int h = kh * G + g;
      for (int sp = 0; sp < splits; ++sp) {
        const size_t at = (size_t(kh) * splits + sp) * G + size_t(g);
        fold(m[size_t(h)], l[size_t(h)], out + size_t(h) * HD, pm[at], pl[at], po.data() + at * HD, HD);
      }
    }
  if (group) {
    if constexpr (std::is_same_v<T, float>)
      merge_token(out, m.data(), l.data(), NH, HD, *group);
    else
      ATOLL_CHECK(false) << "tree attention decodes in fp32";
  }
  // The token sees its own key on some rank, so l > 0 after the merge.
  for (int h = 0; h < NH; ++h) {
    const T inv = T(1) / l[size_t(h)];
    for (int e = 0; e < HD; ++e) out[size_t(h) * HD + e] *= inv;
  }
}

template void cache_block<float>(float*, float*, const float*, const float*, int, int, int, const CacheShard&);
template void cache_block<double>(double*, double*, const double*, const double*, int, int, int, const CacheShard&);
template void attend_prefix<float>(float*, const float*, const float*, const float*, int, int, int, int, int,
                                   const CacheShard&, Collective*);
template void attend_prefix<double>(double*, const double*, const double*, const double*, int, int, int, int, int,
                                    const CacheShard&, Collective*);

template void attend_token<float>(float*, const float*, const float*, const float*, int, int, int, int, Collective*);
template void attend_token<double>(double*, const double*, const double*, const double*, int, int, int, int,
                                   Collective*);

}  // namespace atl
