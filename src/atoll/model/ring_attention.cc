#include "atoll/model/ring_attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <vector>

#include "atoll/core/check.h"

namespace atl {
namespace {

// A chunk a rank holds: its index of 2P, and where its rows sit among the rank's local rows.
struct LocalChunk {
  int id, at, len;
};
using Chunks = std::array<LocalChunk, 2>;

Chunks chunks_of(const ZigzagLayout& z, int r) {
  const int a = z.first_chunk(r), b = z.second_chunk(r);
  return {{{a, 0, z.chunk_len(a)}, {b, z.chunk_len(a), z.chunk_len(b)}}};
}

// The keys of chunk `key` that row `row` of chunk `query` sees: [0, limit).
int visible_keys(int query, int row, const LocalChunk& key) {
  if (key.id > query) return 0;
  return key.id == query ? row + 1 : key.len;
}

// Which of this rank's chunks local row i is in, and its row within it.
std::pair<int, int> chunk_row(const Chunks& c, int i) { return i < c[0].len ? std::pair{c[0].id, i} : std::pair{c[1].id, i - c[0].len}; }

template <typename T>
T dot(const T* a, const T* b, int n) {
  T s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// One block of the forward ring: every query row of this rank streams the keys it sees of the
// block (Tk rows in chunks kc) into its running max m, sum l and unnormalised output acc.
// acc[B,Tq,NH,HD], m, l[B,NH,Tq] (+= in the online-softmax sense).
template <typename T>
void attend_block(T* acc, T* m, T* l, const T* q, int Tq, const Chunks& qc, const T* k, const T* v, int Tk,
                  const Chunks& kc, const RingDims& d) {
  const int NH = d.NH, NKV = d.NKV, HD = d.HD, per_kv = NH / NKV;
  const T scale = T(1) / std::sqrt(T(HD));
#pragma omp parallel
  {
    std::vector<T> s(size_t(std::max(Tk, 1)));  // one row of scores
#pragma omp for collapse(3) schedule(dynamic, 16)
    for (int b = 0; b < d.B; ++b)
      for (int h = 0; h < NH; ++h)
        for (int i = 0; i < Tq; ++i) {
          const auto [qid, qrow] = chunk_row(qc, i);
          const int kh = h / per_kv;
          const T* qi = q + ((size_t(b) * Tq + i) * NH + h) * HD;
          int n = 0;
          T mx = -INFINITY;
          for (const LocalChunk& c : kc)
            for (int t = 0, lim = visible_keys(qid, qrow, c); t < lim; ++t) {
              s[n] = scale * dot(qi, k + ((size_t(b) * Tk + c.at + t) * NKV + kh) * HD, HD);
              mx = std::max(mx, s[n++]);
            }
          if (n == 0) continue;
          const size_t at = (size_t(b) * NH + h) * Tq + i;
          const T m_new = std::max(m[at], mx);
          const T corr = std::exp(m[at] - m_new);  // 0 while m is -inf
          T* o = acc + ((size_t(b) * Tq + i) * NH + h) * HD;
          T sum = l[at] * corr;
          for (int e = 0; e < HD; ++e) o[e] *= corr;
          n = 0;
          for (const LocalChunk& c : kc)
            for (int t = 0, lim = visible_keys(qid, qrow, c); t < lim; ++t) {
              const T p = std::exp(s[n++] - m_new);
              const T* vr = v + ((size_t(b) * Tk + c.at + t) * NKV + kh) * HD;
              sum += p;
              for (int e = 0; e < HD; ++e) o[e] += p * vr[e];
            }
          l[at] = sum, m[at] = m_new;
        }
  }
}

// One block of the backward ring, from P = exp(scale q·k - lse) and dS = P (dout·v - D):
// dq (+=) over the block's keys, parallel over query rows; then dk, dv (+=) of the block over
// this rank's queries, parallel over key rows (each gradient row has one writer, no atomics).
template <typename T>
void attend_block_backward(T* dq, T* dk, T* dv, const T* dout, const T* D, const T* lse, const T* q, int Tq,
                           const Chunks& qc, const T* k, const T* v, int Tk, const Chunks& kc, const RingDims& d) {
  const int NH = d.NH, NKV = d.NKV, HD = d.HD, per_kv = NH / NKV;
  const T scale = T(1) / std::sqrt(T(HD));
  auto grad_s = [&](int b, int h, int i, const T* kr, const T* vr, T* p) {
    const size_t at = (size_t(b) * NH + h) * Tq + i;
    const T* qi = q + ((size_t(b) * Tq + i) * NH + h) * HD;
    const T* gi = dout + ((size_t(b) * Tq + i) * NH + h) * HD;
    *p = std::exp(scale * dot(qi, kr, HD) - lse[at]);
    return *p * (dot(gi, vr, HD) - D[at]);
  };
#pragma omp parallel for collapse(3) schedule(dynamic, 16)
  for (int b = 0; b < d.B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < Tq; ++i) {
        const auto [qid, qrow] = chunk_row(qc, i);
        T* g = dq + ((size_t(b) * Tq + i) * NH + h) * HD;
        for (const LocalChunk& c : kc)
          for (int t = 0, lim = visible_keys(qid, qrow, c); t < lim; ++t) {
            const size_t kv = ((size_t(b) * Tk + c.at + t) * NKV + h / per_kv) * HD;
            T p;
            const T ds = scale * grad_s(b, h, i, k + kv, v + kv, &p);
            for (int e = 0; e < HD; ++e) g[e] += ds * k[kv + e];
          }
      }
#pragma omp parallel for collapse(3) schedule(dynamic, 16)
  for (int b = 0; b < d.B; ++b)
    for (int kh = 0; kh < NKV; ++kh)
      for (int j = 0; j < Tk; ++j) {
        const auto [kid, krow] = chunk_row(kc, j);
        const size_t kv = ((size_t(b) * Tk + j) * NKV + kh) * HD;
        for (const LocalChunk& c : qc) {
          // Rows of query chunk c that see key row krow of chunk kid.
          if (kid > c.id) continue;
          for (int t = kid == c.id ? krow : 0; t < c.len; ++t)
            for (int h = kh * per_kv; h < (kh + 1) * per_kv; ++h) {
              const int i = c.at + t;
              T p;
              const T ds = scale * grad_s(b, h, i, k + kv, v + kv, &p);
              const T* qi = q + ((size_t(b) * Tq + i) * NH + h) * HD;
              const T* gi = dout + ((size_t(b) * Tq + i) * NH + h) * HD;
              for (int e = 0; e < HD; ++e) dv[kv + e] += p * gi[e], dk[kv + e] += ds * qi[e];
            }
        }
      }
}

size_t largest_block(const ZigzagLayout& z) {
  int most = 0;
  for (int r = 0; r < z.P; ++r) most = std::max(most, z.local_len(r));
  return size_t(most);
}

}  // namespace

// Copies rank r's rows between whole[B, T, W] and local[B, T_r, W], either way.
template <typename X>
void zigzag_copy(X* whole, X* local, int B, size_t W, const ZigzagLayout& z, int r, bool to_local) {
  const int Tr = z.local_len(r);
  for (int b = 0; b < B; ++b)
    for (const LocalChunk& ch : chunks_of(z, r)) {
      X* w = whole + (size_t(b) * z.T + z.chunk_begin(ch.id)) * W;
      X* l = local + (size_t(b) * Tr + ch.at) * W;
      to_local ? std::copy_n(w, size_t(ch.len) * W, l) : std::copy_n(l, size_t(ch.len) * W, w);
    }
}

template <typename X>
void zigzag_take(X* local, const X* whole, int B, size_t W, const ZigzagLayout& z, int r) {
  zigzag_copy(const_cast<X*>(whole), local, B, W, z, r, true);  // reads whole only
}

template <typename X>
void zigzag_put(X* whole, const X* local, int B, size_t W, const ZigzagLayout& z, int r) {
  zigzag_copy(whole, const_cast<X*>(local), B, W, z, r, false);  // reads local only
}

template <typename T>
void ring_attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const RingDims& d,
                            const ZigzagLayout& z, Collective& group) {
  const int P = z.P, r = group.rank(), Tq = z.local_len(r);
  ATOLL_CHECK_EQ(group.size(), P) << "ring attention over a group of another size than the layout's";
  ATOLL_CHECK(d.NKV > 0 && d.NH % d.NKV == 0) << d.NH << " query heads, " << d.NKV << " key/value heads";
  const size_t KVD = size_t(d.NKV) * d.HD, rows = size_t(d.B) * Tq;
  std::vector<T> l(size_t(d.B) * d.NH * Tq, T(0));
  std::fill(lse, lse + l.size(), T(-INFINITY));  // the running max, until the end
  std::fill(out, out + rows * d.NH * d.HD, T(0));
  // The block in hand and the one arriving: [k | v] of B·T_src rows each.
  std::vector<T> cur(2 * size_t(d.B) * largest_block(z) * KVD), next(cur.size());
  std::copy_n(k, rows * KVD, cur.data());
  std::copy_n(v, rows * KVD, cur.data() + rows * KVD);
  for (int s = 0; s < P; ++s) {
    const int src = (r - s + P) % P, Tk = z.local_len(src), Tn = z.local_len((src - 1 + P) % P);
    std::unique_ptr<Collective::Pending> moving;
    if (s + 1 < P)
      moving = group.exchange(cur.data(), 2 * size_t(d.B) * Tk * KVD * sizeof(T), (r + 1) % P, next.data(),
                              2 * size_t(d.B) * Tn * KVD * sizeof(T), (r - 1 + P) % P);
    attend_block(out, lse, l.data(), q, Tq, chunks_of(z, r), cur.data(), cur.data() + size_t(d.B) * Tk * KVD, Tk,
                 chunks_of(z, src), d);
    if (moving) moving->wait(), cur.swap(next);
  }
  // Every row sees itself, so l > 0: out = acc / l, lse = m + log l.
  for (int b = 0; b < d.B; ++b)
    for (int h = 0; h < d.NH; ++h)
      for (int i = 0; i < Tq; ++i) {
        const size_t at = (size_t(b) * d.NH + h) * Tq + i;
        T* o = out + ((size_t(b) * Tq + i) * d.NH + h) * d.HD;
        for (int e = 0; e < d.HD; ++e) o[e] /= l[at];
        lse[at] += std::log(l[at]);
      }
}

template <typename T>
void ring_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                             const T* v, const RingDims& d, const ZigzagLayout& z, Collective& group) {
  const int P = z.P, r = group.rank(), Tq = z.local_len(r);
  ATOLL_CHECK_EQ(group.size(), P) << "ring attention over a group of another size than the layout's";
  const size_t KVD = size_t(d.NKV) * d.HD, QD = size_t(d.NH) * d.HD, rows = size_t(d.B) * Tq;
  // D = rowsum(dout ∘ out) per query row and head [B,NH,Tq].
  std::vector<T> D(size_t(d.B) * d.NH * Tq);
  for (int b = 0; b < d.B; ++b)
    for (int h = 0; h < d.NH; ++h)
      for (int i = 0; i < Tq; ++i) {
        const size_t row = ((size_t(b) * Tq + i) * d.NH + h) * d.HD;
        D[(size_t(b) * d.NH + h) * Tq + i] = dot(dout + row, out + row, d.HD);
      }
  std::fill(dq, dq + rows * QD, T(0));
  // The block in hand and the one arriving: [k | v | dk | dv] of B·T_src rows each.
  std::vector<T> cur(4 * size_t(d.B) * largest_block(z) * KVD, T(0)), next(cur.size());
  std::copy_n(k, rows * KVD, cur.data());
  std::copy_n(v, rows * KVD, cur.data() + rows * KVD);
  for (int s = 0; s < P; ++s) {
    const int src = (r - s + P) % P, Tk = z.local_len(src), Tn = z.local_len((src - 1 + P) % P);
    const size_t part = size_t(d.B) * Tk * KVD, next_part = size_t(d.B) * Tn * KVD;
    const int to = (r + 1) % P, from = (r - 1 + P) % P;
    // The next block's keys and values move while this one's gradients are computed; its
    // gradients follow once they hold this rank's share. The last step sends each block home.
    std::unique_ptr<Collective::Pending> kv, grads;
    if (s + 1 < P)
      kv = group.exchange(cur.data(), 2 * part * sizeof(T), to, next.data(), 2 * next_part * sizeof(T), from);
    T* blk = cur.data();
    attend_block_backward(dq, blk + 2 * part, blk + 3 * part, dout, D.data(), lse, q, Tq, chunks_of(z, r), blk,
                          blk + part, Tk, chunks_of(z, src), d);
    if (P > 1)
      grads = group.exchange(blk + 2 * part, 2 * part * sizeof(T), to, next.data() + 2 * next_part,
                             2 * next_part * sizeof(T), from);
    if (kv) kv->wait();
    if (grads) grads->wait(), cur.swap(next);
  }
  // Home again: this rank's own block, with every rank's share of dk and dv.
  std::copy_n(cur.data() + 2 * rows * KVD, rows * KVD, dk);
  std::copy_n(cur.data() + 3 * rows * KVD, rows * KVD, dv);
}

#define ATOLL_RING_ATTENTION(T)                                                                                    \
  template void zigzag_take<T>(T*, const T*, int, size_t, const ZigzagLayout&, int);                             \
  template void zigzag_put<T>(T*, const T*, int, size_t, const ZigzagLayout&, int);                              \
  template void ring_attention_forward<T>(T*, T*, const T*, const T*, const T*, const RingDims&,                  \
                                          const ZigzagLayout&, Collective&);                                      \
  template void ring_attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*, \
                                           const RingDims&, const ZigzagLayout&, Collective&);
ATOLL_RING_ATTENTION(float)
ATOLL_RING_ATTENTION(double)
template void zigzag_take<int32_t>(int32_t*, const int32_t*, int, size_t, const ZigzagLayout&, int);
template void zigzag_put<int32_t>(int32_t*, const int32_t*, int, size_t, const ZigzagLayout&, int);
#undef ATOLL_RING_ATTENTION

}  // namespace atl
