// CCA's rows over a split sequence (docs/long_context.md), the bookkeeping shared by the CPU part
// (model/attention_cca.cc) and its CUDA mirror (model/attention_cca.cu), so that both lay out and
// send the same rows.
//
// Runs: a call's tokens of each sequence are one or two runs (TokenPositions). The convolutions see
// run i of every sequence as one block [B, bnd + len, CC] of the pre-convolution rows x (bnd = lag =
// t0-1 + t1-1 rows of the chunk before first, when the run has a predecessor; a run that starts its
// sequence reads the convolutions' zero padding instead) and [B, bnd + len + t1-1, CC] of the
// depthwise output y. Whole sequences are one run with no boundary: x is [B,T,CC], y [B,T+t1-1,CC].
//
// Boundary messages (model/chunk_boundary.h moves them): for run i of sequence b, message i*B + b
// of W = lag*CC + KVD/2 floats, a run's last lag x rows then its last token's delayed value half
// (forward, sent to the next chunk's holder: `tails`), or what the run reads before itself
// (`heads`); backward sends the gradients of the heads back to the tails they came from.
#pragma once

#include <cstddef>
#include <vector>

#include "atoll/model/part.h"

namespace atl {

struct CcaRun {
  int start, len, bnd;  // its first token in the whole sequence, its tokens, its boundary rows (0 or lag)
  int local;            // its first row among a sequence's T local rows
  size_t x_row, y_row;  // the first row of its block [B, bnd+len, CC] in x, [B, bnd+len+t1-1, CC] in y
  int rows() const { return bnd + len; }
};
struct CcaRuns {
  int n = 0;
  CcaRun run[TokenPositions::kMaxRuns];
  size_t x_rows = 0, y_rows = 0;  // rows of x and of y for the call
};

// The runs of B sequences of T local tokens at `pos`, lag = t0-1 + t1-1.
CcaRuns cca_runs(const TokenPositions& pos, int B, int T, int lag, int t1);

// Rows of x and of y that any call of at most max_batch sequences and max_tokens tokens needs.
size_t cca_x_rows_max(int max_tokens, int max_batch, int lag);
size_t cca_y_rows_max(int max_tokens, int max_batch, int lag, int t1);

// fn(local row, x row, len) for each run of each sequence: its first row in the [B,T] layout and
// in x's. Whole sequences are one span (the two layouts agree).
template <class Fn>
void cca_for_each_span(const CcaRuns& R, int B, int T, Fn fn) {
  if (R.n == 1 && R.run[0].bnd == 0) return fn(size_t(0), size_t(0), B * T);
  for (int i = 0; i < R.n; ++i)
    for (int b = 0; b < B; ++b) {
      const CcaRun& u = R.run[i];
      fn(size_t(b) * T + u.local, u.x_row + size_t(b) * u.rows() + u.bnd, u.len);
    }
}

// One sequence's message of one run; every field is a float offset.
struct CcaMessage {
  size_t msg;      // in the messages [runs, B, W]
  size_t tail_x;   // the run's last lag rows in x (sent forward; their gradient comes back here)
  size_t head_x;   // the run's boundary rows in x (the predecessor's tail lands here; has_pred only)
  size_t last_vd;  // the run's last token's delayed half in vd [N, KVD/2]
  size_t first_v;  // the run's first token's delayed half in v [N, KVD] (the predecessor's, or 0)
  bool has_pred;   // the run has a chunk before it (start > 0)
};
struct CcaBoundary {
  size_t x_floats = 0;  // lag*CC: the pre-convolution rows of a message
  size_t half = 0;      // KVD/2: the delayed value half
  size_t per_run = 0;   // B*W: one run's messages, the n of chunk_tails_forward
  std::vector<CcaMessage> msgs;  // run i, sequence b at i*B + b
  size_t W() const { return x_floats + half; }
  size_t floats() const { return msgs.size() * W(); }
};

// The messages of a context-parallel call (two runs, each at least max(lag, 1) tokens: the config
// refuses shorter chunks, config/context_parallel.h).
CcaBoundary cca_boundary(const CcaRuns& R, int B, int T, int lag, int CC, int KVD);

// The host side of the exchange (the CPU part's; the device part copies the same pieces):
// tails[floats] (=) each run's last x rows and delayed half; x's boundary rows (=) the heads'.
template <typename T>
void cca_pack_tails(T* tails, const T* x, const T* vd, const CcaBoundary& p);
template <typename T>
void cca_unpack_heads(T* x, const T* heads, const CcaBoundary& p);
// v's first delayed half of each run (=) its predecessor's from heads, or 0 at the sequence's start.
template <typename T>
void cca_shift_values(T* v, const T* heads, const CcaBoundary& p);
// Backward: dheads (=) the gradients of each run's boundary rows (dx) and of the delayed half its
// first token read (dv); then dx's tail rows (+=) and dvd's last token (=) from the returned dtails.
template <typename T>
void cca_pack_dheads(T* dheads, const T* dx, const T* dv, const CcaBoundary& p);
template <typename T>
void cca_unpack_dtails(T* dx, T* dvd, const T* dtails, const CcaBoundary& p);

}  // namespace atl
