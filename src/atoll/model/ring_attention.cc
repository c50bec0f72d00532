#include "atoll/model/ring_attention.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "atoll/backend/cpu/gemm.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"

namespace atl {
namespace {

constexpr int kTile = 64;  // query rows per tile, as the single-process kernel's block

// A chunk a rank holds: its index of 2P, and where its rows sit among the rank's local rows.
struct LocalChunk {
  int id, at, len;
};
using Chunks = std::array<LocalChunk, 2>;

Chunks chunks_of(const ZigzagLayout& z, int r) {
  const int a = z.first_chunk(r), b = z.second_chunk(r);
  return {{{a, 0, z.chunk_len(a)}, {b, z.chunk_len(a), z.chunk_len(b)}}};
}

// Rows [t0, t0 + rows) of this rank's chunk `chunk` (0 or 1): the unit of work, one head each.
struct QueryTile {
  int chunk, t0, rows;
};
std::vector<QueryTile> query_tiles(const Chunks& qc) {
  std::vector<QueryTile> tiles;
  for (int a = 0; a < 2; ++a)
    for (int t0 = 0; t0 < qc[a].len; t0 += kTile) tiles.push_back({a, t0, std::min(kTile, qc[a].len - t0)});
  return tiles;
}

// The keys [0, n) of chunk `key` that a tile of chunk `query` reads: none when the key chunk
// comes later, all when earlier; when it is the same chunk, row t0 + i sees keys [0, t0 + i].
struct Visible {
  int n;
  bool causal;
};
Visible visible(const LocalChunk& query, const QueryTile& tile, const LocalChunk& key) {
  if (key.len == 0 || key.id > query.id) return {0, false};
  if (key.id == query.id) return {tile.t0 + tile.rows, true};
  return {key.len, false};
}

// Strides of the [B, rows, heads, HD] tensors: one token's row of every head.
struct Strides {
  size_t qd, kvd;
  int per_kv;
};
Strides strides(const RingDims& d) { return {size_t(d.NH) * d.HD, size_t(d.NKV) * d.HD, d.NH / d.NKV}; }

int widest(const Chunks& c) { return std::max({c[0].len, c[1].len, 1}); }

// One block of the forward ring: every query tile of this rank, one head at a time, against
// each key chunk of the block (Tk rows, chunks kc) it sees: s = scale Q Kᵀ, then the online
// softmax folds the tile into the running max m and sum l of each row and rescales its
// unnormalised output acc before acc += exp(s - m) V. acc[B,Tq,NH,HD], m, l[B,NH,Tq] (merged).
template <typename T>
void attend_block(T* acc, T* m, T* l, const T* q, int Tq, const Chunks& qc, const T* k, const T* v, int Tk,
                  const Chunks& kc, const RingDims& d) {
  const Strides st = strides(d);
  const int HD = d.HD;
  const T scale = T(1.0 / std::sqrt(double(HD)));
  const std::vector<QueryTile> tiles = query_tiles(qc);
  const int n_tiles = int(tiles.size()), width = widest(kc);
#pragma omp parallel
  {
    std::vector<T> s(size_t(kTile) * width);
#pragma omp for collapse(3) schedule(dynamic)
    for (int b = 0; b < d.B; ++b)
      for (int h = 0; h < d.NH; ++h)
        for (int ti = 0; ti < n_tiles; ++ti) {
          const QueryTile& tile = tiles[size_t(ti)];
          const LocalChunk& qch = qc[size_t(tile.chunk)];
          const int i0 = qch.at + tile.t0;  // the tile's first local row
          const T* qt = q + (size_t(b) * Tq + i0) * st.qd + size_t(h) * HD;
          T* ot = acc + (size_t(b) * Tq + i0) * st.qd + size_t(h) * HD;
          T* mt = m + (size_t(b) * d.NH + h) * Tq + i0;
          T* lt = l + (size_t(b) * d.NH + h) * Tq + i0;
          const size_t kv_head = size_t(h / st.per_kv) * HD;
          for (const LocalChunk& kch : kc) {
            const Visible vis = visible(qch, tile, kch);
            if (vis.n == 0) continue;
            const int n = vis.n;
            const T* kt = k + (size_t(b) * Tk + kch.at) * st.kvd + kv_head;
            const T* vt = v + (size_t(b) * Tk + kch.at) * st.kvd + kv_head;
            gemm<T>(false, true, tile.rows, n, HD, scale, qt, int(st.qd), kt, int(st.kvd), T(0), s.data(), n);
            for (int r = 0; r < tile.rows; ++r) {
              T* row = s.data() + size_t(r) * n;
              const int valid = vis.causal ? tile.t0 + r + 1 : n;  // every row sees at least one key
              T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
              for (int j = 0; j < valid; ++j) mx = std::max(mx, row[j]);
              const T m_new = std::max(mt[r], mx);
              const T corr = std::exp(mt[r] - m_new);  // 0 while m is -inf
              T sum = 0;
#pragma omp simd reduction(+ : sum)
              for (int j = 0; j < valid; ++j) sum += (row[j] = std::exp(row[j] - m_new));
              for (int j = valid; j < n; ++j) row[j] = 0;
              lt[r] = lt[r] * corr + sum, mt[r] = m_new;
              T* o = ot + size_t(r) * st.qd;
              for (int e = 0; e < HD; ++e) o[e] *= corr;
            }
            gemm<T>(false, false, tile.rows, HD, n, T(1), s.data(), n, vt, int(st.kvd), T(1), ot, int(st.qd));
          }
        }
  }
}

// One block of the backward ring, tile by tile as the forward, from P = exp(scale Q Kᵀ - lse)
// and dS = P ∘ (dO Vᵀ - D) · scale: dq (+=) dS K for this rank's queries; dk (+=) dSᵀ Q and
// dv (+=) Pᵀ dO for the block's keys. A task owns one key/value head of one sequence, so the
// dk, dv rows of that head and the dq rows of its query heads: one writer each, no atomics.
template <typename T>
void attend_block_backward(T* dq, T* dk, T* dv, const T* dout, const T* D, const T* lse, const T* q, int Tq,
                           const Chunks& qc, const T* k, const T* v, int Tk, const Chunks& kc, const RingDims& d) {
  const Strides st = strides(d);
  const int HD = d.HD;
  const T scale = T(1.0 / std::sqrt(double(HD)));
  const std::vector<QueryTile> tiles = query_tiles(qc);
  const int width = widest(kc);
#pragma omp parallel
  {
    std::vector<T> p(size_t(kTile) * width), dp(size_t(kTile) * width);
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < d.B; ++b)
      for (int kh = 0; kh < d.NKV; ++kh)
        for (int h = kh * st.per_kv; h < (kh + 1) * st.per_kv; ++h)
          for (const QueryTile& tile : tiles) {
            const LocalChunk& qch = qc[size_t(tile.chunk)];
            const int i0 = qch.at + tile.t0;
            const size_t q_at = (size_t(b) * Tq + i0) * st.qd + size_t(h) * HD, row_at = (size_t(b) * d.NH + h) * Tq + i0;
            for (const LocalChunk& kch : kc) {
              const Visible vis = visible(qch, tile, kch);
              if (vis.n == 0) continue;
              const int n = vis.n;
              const size_t kv_at = (size_t(b) * Tk + kch.at) * st.kvd + size_t(kh) * HD;
              gemm<T>(false, true, tile.rows, n, HD, scale, q + q_at, int(st.qd), k + kv_at, int(st.kvd), T(0),
                      p.data(), n);
              gemm<T>(false, true, tile.rows, n, HD, T(1), dout + q_at, int(st.qd), v + kv_at, int(st.kvd), T(0),
                      dp.data(), n);
              for (int r = 0; r < tile.rows; ++r) {
                T* pr = p.data() + size_t(r) * n;
                T* dr = dp.data() + size_t(r) * n;
                const int valid = vis.causal ? tile.t0 + r + 1 : n;
                const T lse_r = lse[row_at + size_t(r)], D_r = D[row_at + size_t(r)];
#pragma omp simd
                for (int j = 0; j < valid; ++j) {
                  pr[j] = std::exp(pr[j] - lse_r);
                  dr[j] = pr[j] * (dr[j] - D_r) * scale;
                }
                for (int j = valid; j < n; ++j) pr[j] = dr[j] = 0;
              }
              gemm<T>(false, false, tile.rows, HD, n, T(1), dp.data(), n, k + kv_at, int(st.kvd), T(1), dq + q_at,
                      int(st.qd));  // dQ += dS K
              gemm<T>(true, false, n, HD, tile.rows, T(1), dp.data(), n, q + q_at, int(st.qd), T(1), dk + kv_at,
                      int(st.kvd));  // dK += dSᵀ Q
              gemm<T>(true, false, n, HD, tile.rows, T(1), p.data(), n, dout + q_at, int(st.qd), T(1), dv + kv_at,
                      int(st.kvd));  // dV += Pᵀ dO
            }
          }
  }
}

size_t largest_block(const ZigzagLayout& z) {
  int most = 0;
  for (int r = 0; r < z.P; ++r) most = std::max(most, z.local_len(r));
  return size_t(most);
}

// The bench-only switches (ring_attention.h), each read once.
bool env_is(const char* name, const std::string& value) {
  const char* v = std::getenv(name);
  return v && v == value;
}

bool overlap_transfers() {
  static const bool on = !env_is("ATOLL_RING_OVERLAP", "0");
  return on;
}

bool sync_before_transfers() {
  static const bool on = env_is("ATOLL_RING_SYNC", "1");
  return on;
}

RingClock g_clock;  // ring_clock(); ring attention runs on one thread of a process

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Adds the seconds since `since` to `to` and returns now.
double tick(double& to, double since) {
  const double now = seconds_now();
  to += now - since;
  return now;
}

// Waits for a transfer (if any), counting the time blocked.
void wait_for(std::unique_ptr<Collective::Pending>& p) {
  if (!p) return;
  const double t0 = seconds_now();
  p->wait();
  tick(g_clock.wait_s, t0);
  p.reset();
}

// Starts a ring transfer; under ATOLL_RING_SYNC=1 first meets the neighbours (a one-byte
// exchange, its time counted as sync_s), so that the transfer's wait holds no peer's lateness.
std::unique_ptr<Collective::Pending> start_transfer(Collective& group, const void* send, size_t send_bytes, int to,
                                                    void* recv, size_t recv_bytes, int from) {
  if (sync_before_transfers()) {
    const char out = 0;
    char in = 0;
    const double t0 = seconds_now();
    group.exchange(&out, 1, to, &in, 1, from)->wait();
    tick(g_clock.sync_s, t0);
  }
  return group.exchange(send, send_bytes, to, recv, recv_bytes, from);
}

}  // namespace

ZigzagLayout context_layout(int T, int P) {
  static const bool plain = [] {
    const char* v = std::getenv("ATOLL_CP_LAYOUT");
    const std::string s = v ? v : "zigzag";
    if (s != "zigzag" && s != "plain")
      throw ConfigError("ATOLL_CP_LAYOUT = \"" + s + "\" is not a layout of context parallelism; fix: unset it (the " +
                        "zigzag layout), or ATOLL_CP_LAYOUT=plain (contiguous chunks, for benchmarks only)");
    return s == "plain";
  }();
  return {.T = T, .P = P, .contiguous = plain};
}

RingClock ring_clock() { return g_clock; }

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
  const bool overlap = overlap_transfers();
  std::vector<T> l(size_t(d.B) * d.NH * Tq, T(0));
  std::fill(lse, lse + l.size(), -std::numeric_limits<T>::infinity());  // the running max, until the end
  std::fill(out, out + rows * d.NH * d.HD, T(0));
  // The block in hand and the one arriving: [k | v] of B·T_src rows each.
  std::vector<T> cur(2 * size_t(d.B) * largest_block(z) * KVD), next(cur.size());
  std::copy_n(k, rows * KVD, cur.data());
  std::copy_n(v, rows * KVD, cur.data() + rows * KVD);
  for (int s = 0; s < P; ++s) {
    const auto [src, Tk, Tn, to, from] = RingStep::at(z, r, s);
    std::unique_ptr<Collective::Pending> moving;
    if (s + 1 < P)
      moving = start_transfer(group, cur.data(), 2 * size_t(d.B) * Tk * KVD * sizeof(T), to, next.data(),
                              2 * size_t(d.B) * Tn * KVD * sizeof(T), from);
    if (!overlap) wait_for(moving);
    const double t0 = seconds_now();
    attend_block(out, lse, l.data(), q, Tq, chunks_of(z, r), cur.data(), cur.data() + size_t(d.B) * Tk * KVD, Tk,
                 chunks_of(z, src), d);
    tick(g_clock.compute_s, t0);
    if (s + 1 < P) wait_for(moving), cur.swap(next);
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
                             const T* v, const RingDims& d, const ZigzagLayout& z, Collective& group,
                             const std::function<void()>& dq_ready) {
  const int P = z.P, r = group.rank(), Tq = z.local_len(r), to = (r + 1) % P, from = (r - 1 + P) % P;
  ATOLL_CHECK_EQ(group.size(), P) << "ring attention over a group of another size than the layout's";
  const size_t KVD = size_t(d.NKV) * d.HD, QD = size_t(d.NH) * d.HD, rows = size_t(d.B) * Tq;
  const bool overlap = overlap_transfers();
  // D = rowsum(dout ∘ out) per query row and head [B,NH,Tq].
  std::vector<T> D(size_t(d.B) * d.NH * Tq);
  for (int b = 0; b < d.B; ++b)
    for (int h = 0; h < d.NH; ++h)
      for (int i = 0; i < Tq; ++i) {
        const size_t row = ((size_t(b) * Tq + i) * d.NH + h) * d.HD;
        T acc = 0;
        for (int e = 0; e < d.HD; ++e) acc += dout[row + e] * out[row + e];
        D[(size_t(b) * d.NH + h) * Tq + i] = acc;
      }
  std::fill(dq, dq + rows * QD, T(0));
  // Keys and values: the block in hand and the one arriving, [k | v] of B·T_src rows each.
  // Gradient sums [dk | dv]: this rank's share of the block in hand (mine), the sums that
  // arrived for it (in), and the sums passed on (out, read by the transfer until it is waited).
  const size_t block = 2 * size_t(d.B) * largest_block(z) * KVD;
  std::vector<T> cur(block), next(block), mine(block), in(block, T(0)), sent(block);
  std::copy_n(k, rows * KVD, cur.data());
  std::copy_n(v, rows * KVD, cur.data() + rows * KVD);
  std::unique_ptr<Collective::Pending> kv, grads;
  for (int s = 0; s < P; ++s) {
    const RingStep step = RingStep::at(z, r, s);
    const int src = step.src, Tk = step.Tk, Tn = step.Tn;
    const size_t part = size_t(d.B) * Tk * KVD, next_part = size_t(d.B) * Tn * KVD;
    // The next block's keys and values move while this one is computed, and so do the sums
    // this rank passed on at the previous step (they bring this block's sums in).
    if (s + 1 < P)
      kv = start_transfer(group, cur.data(), 2 * part * sizeof(T), to, next.data(), 2 * next_part * sizeof(T), from);
    if (!overlap) wait_for(kv), wait_for(grads);
    const double t0 = seconds_now();
    std::fill(mine.begin(), mine.begin() + std::ptrdiff_t(2 * part), T(0));
    attend_block_backward(dq, mine.data(), mine.data() + part, dout, D.data(), lse, q, Tq, chunks_of(z, r), cur.data(),
                          cur.data() + part, Tk, chunks_of(z, src), d);
    tick(g_clock.compute_s, t0);
    wait_for(grads);  // this block's sums from the ranks before (none at the first step: its own)
    for (size_t i = 0; i < 2 * part; ++i) sent[i] = (s == 0 ? T(0) : in[i]) + mine[i];
    if (P > 1)
      grads = start_transfer(group, sent.data(), 2 * part * sizeof(T), to, in.data(), 2 * next_part * sizeof(T), from);
    if (s + 1 < P) wait_for(kv), cur.swap(next);
  }
  // Home again: this rank's own block's sums over every rank (P = 1: its own share), while the
  // caller's dq work runs (dq is final: the last step's block is computed).
  if (dq_ready) dq_ready();
  wait_for(grads);
  const T* home = P > 1 ? in.data() : sent.data();
  std::copy_n(home, rows * KVD, dk);
  std::copy_n(home + rows * KVD, rows * KVD, dv);
}

#define ATOLL_RING_ATTENTION(T)                                                                                    \
  template void zigzag_take<T>(T*, const T*, int, size_t, const ZigzagLayout&, int);                             \
  template void zigzag_put<T>(T*, const T*, int, size_t, const ZigzagLayout&, int);                              \
  template void ring_attention_forward<T>(T*, T*, const T*, const T*, const T*, const RingDims&,                  \
                                          const ZigzagLayout&, Collective&);                                      \
  template void ring_attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*, \
                                           const RingDims&, const ZigzagLayout&, Collective&,                   \
                                           const std::function<void()>&);
ATOLL_RING_ATTENTION(float)
ATOLL_RING_ATTENTION(double)
template void zigzag_take<int32_t>(int32_t*, const int32_t*, int, size_t, const ZigzagLayout&, int);
template void zigzag_put<int32_t>(int32_t*, const int32_t*, int, size_t, const ZigzagLayout&, int);
#undef ATOLL_RING_ATTENTION

}  // namespace atl
