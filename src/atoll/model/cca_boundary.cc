#include "atoll/model/cca_boundary.h"

#include <algorithm>

#include "atoll/core/check.h"

namespace atl {

CcaRuns cca_runs(const TokenPositions& pos, int B, int T, int lag, int t1) {
  CcaRuns R;
  R.n = pos.runs;
  int local = 0;
  for (int i = 0; i < pos.runs; ++i) {
    CcaRun& u = R.run[i];
    u.start = pos.start[i], u.len = pos.len[0] == 0 ? T : pos.len[i], u.bnd = u.start > 0 ? lag : 0;
    u.local = local, u.x_row = R.x_rows, u.y_row = R.y_rows;
    local += u.len, R.x_rows += size_t(B) * u.rows(), R.y_rows += size_t(B) * (u.rows() + t1 - 1);
  }
  ATOLL_CHECK_EQ(local, T) << "token runs";
  return R;
}

// At most two runs of a sequence, each with up to lag boundary rows before it and t1-1 more y
// rows (model/part_kinds.cc counts the same).
size_t cca_x_rows_max(int max_tokens, int max_batch, int lag) {
  return size_t(max_tokens) + size_t(TokenPositions::kMaxRuns) * max_batch * lag;
}
size_t cca_y_rows_max(int max_tokens, int max_batch, int lag, int t1) {
  return cca_x_rows_max(max_tokens, max_batch, lag) + size_t(TokenPositions::kMaxRuns) * max_batch * (t1 - 1);
}

CcaBoundary cca_boundary(const CcaRuns& R, int B, int T, int lag, int CC, int KVD) {
  ATOLL_CHECK_EQ(R.n, TokenPositions::kMaxRuns) << "CCA's boundary exchange runs on a rank's two chunks";
  CcaBoundary p;
  p.x_floats = size_t(lag) * CC, p.half = size_t(KVD) / 2, p.per_run = size_t(B) * p.W();
  for (int i = 0; i < R.n; ++i) {
    const CcaRun& u = R.run[i];
    ATOLL_CHECK_GE(u.len, std::max(lag, 1)) << "a chunk shorter than CCA's window (config/context_parallel.h refuses it)";
    for (int b = 0; b < B; ++b) {
      const size_t first_x = u.x_row + size_t(b) * u.rows();  // the block's first row for sequence b
      const size_t first = size_t(b) * T + u.local;           // the run's first local row
      p.msgs.push_back({.msg = (size_t(i) * B + b) * p.W(),
                        .tail_x = (first_x + u.rows() - lag) * CC,
                        .head_x = first_x * CC,
                        .last_vd = (first + u.len - 1) * p.half,
                        .first_v = first * KVD + p.half,
                        .has_pred = u.start > 0});
    }
  }
  return p;
}

template <typename T>
void cca_pack_tails(T* tails, const T* x, const T* vd, const CcaBoundary& p) {
  for (const CcaMessage& m : p.msgs) {
    std::copy_n(x + m.tail_x, p.x_floats, tails + m.msg);
    std::copy_n(vd + m.last_vd, p.half, tails + m.msg + p.x_floats);
  }
}

template <typename T>
void cca_unpack_heads(T* x, const T* heads, const CcaBoundary& p) {
  for (const CcaMessage& m : p.msgs)
    if (m.has_pred) std::copy_n(heads + m.msg, p.x_floats, x + m.head_x);
}

template <typename T>
void cca_shift_values(T* v, const T* heads, const CcaBoundary& p) {
  for (const CcaMessage& m : p.msgs)
    if (m.has_pred) std::copy_n(heads + m.msg + p.x_floats, p.half, v + m.first_v);
    else std::fill_n(v + m.first_v, p.half, T(0));
}

template <typename T>
void cca_pack_dheads(T* dheads, const T* dx, const T* dv, const CcaBoundary& p) {
  for (const CcaMessage& m : p.msgs)
    if (m.has_pred) {
      std::copy_n(dx + m.head_x, p.x_floats, dheads + m.msg);
      std::copy_n(dv + m.first_v, p.half, dheads + m.msg + p.x_floats);
    }
}

template <typename T>
void cca_unpack_dtails(T* dx, T* dvd, const T* dtails, const CcaBoundary& p) {
  for (const CcaMessage& m : p.msgs) {
    const T* from = dtails + m.msg;
    T* to = dx + m.tail_x;
    for (size_t e = 0; e < p.x_floats; ++e) to[e] += from[e];
    std::copy_n(from + p.x_floats, p.half, dvd + m.last_vd);
  }
}

#define ATOLL_CCA_BOUNDARY(T)                                                            \
  template void cca_pack_tails<T>(T*, const T*, const T*, const CcaBoundary&);           \
  template void cca_unpack_heads<T>(T*, const T*, const CcaBoundary&);                   \
  template void cca_shift_values<T>(T*, const T*, const CcaBoundary&);                   \
  template void cca_pack_dheads<T>(T*, const T*, const T*, const CcaBoundary&);          \
  template void cca_unpack_dtails<T>(T*, T*, const T*, const CcaBoundary&);
ATOLL_CCA_BOUNDARY(float)
ATOLL_CCA_BOUNDARY(double)
#undef ATOLL_CCA_BOUNDARY

}  // namespace atl
