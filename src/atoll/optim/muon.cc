#include "atoll/optim/muon.h"

#include <cblas.h>  // OpenBLAS thread control only; products go through backend gemm
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "atoll/backend/cpu/gemm.h"
#include "atoll/backend/cpu/gemm_bf16.h"
#include "atoll/core/check.h"

namespace atl {
namespace {

// Keller Jordan's zeropower_via_newtonschulz5, in the precision T. Each iteration applies
// the odd polynomial p(s) = a s + b s^3 + c s^5 to every singular value of X and keeps the
// singular vectors, so after normalisation (all s <= 1) the result tends to U Vt of the
// input's SVD. Working on the wide orientation [m, n], m <= n, keeps A = X Xt at [m, m].
template <typename T>
void newton_schulz_impl(T* out, const T* in, int rows, int cols, int steps, std::vector<T>* scratch) {
  ATOLL_CHECK(rows > 0 && cols > 0) << rows << "x" << cols;
  ATOLL_CHECK_GE(steps, 0);
  const bool tall = rows > cols;
  const int m = tall ? cols : rows, n = tall ? rows : cols;
  const size_t mn = size_t(m) * n, mm = size_t(m) * m;
  if (scratch->size() < 2 * mn + 2 * mm) scratch->resize(2 * mn + 2 * mm);
  T* x = scratch->data();  // X  [m, n]
  T* y = x + mn;           // X' [m, n], the next iterate
  T* a = y + mn;           // A = X Xt [m, m]
  T* b = a + mm;           // B = b A + c A A [m, m]

  double sumsq = 0.0;  // ||in||_F, accumulated in double
  for (size_t i = 0; i < mn; ++i) sumsq += double(in[i]) * double(in[i]);
  const T scale = T(1.0 / (std::sqrt(sumsq) + 1e-7));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) x[tall ? size_t(c) * n + r : size_t(r) * n + c] = in[size_t(r) * cols + c] * scale;

  for (int s = 0; s < steps; ++s) {
    gemm<T>(false, true, m, m, n, T(1), x, n, x, n, T(0), a, m);  // A = X Xt
    std::memcpy(b, a, mm * sizeof(T));
    gemm<T>(false, false, m, m, m, T(kNsC), a, m, a, m, T(kNsB), b, m);  // B = b A + c A A
    std::memcpy(y, x, mn * sizeof(T));
    gemm<T>(false, false, m, n, m, T(1), b, m, x, n, T(kNsA), y, n);  // X' = a X + B X
    std::swap(x, y);
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) out[size_t(r) * cols + c] = x[tall ? size_t(c) * n + r : size_t(r) * n + c];
}

// Pins a threaded (pthreads) OpenBLAS to one thread for its scope, so that OpenMP threads
// running one matrix each do not also fan out into BLAS's pool. An OpenMP OpenBLAS already runs
// single-threaded inside a parallel region, and its set_num_threads would change OpenMP's own
// count, so it is left alone.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : saved_(openblas_get_parallel() == OPENBLAS_THREAD ? openblas_get_num_threads() : 1) {
    if (saved_ != 1) openblas_set_num_threads(1);
  }
  ~SingleThreadedBlas() {
    if (saved_ != 1) openblas_set_num_threads(saved_);
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int saved_;
};

}  // namespace

void newton_schulz(float* out, const float* in, int rows, int cols, int steps, MuonWorkspace* ws) {
  newton_schulz_impl(out, in, rows, cols, steps, &ws->ns);
}

void newton_schulz(float* out, const float* in, int rows, int cols, int steps) {
  static thread_local MuonWorkspace ws;
  newton_schulz(out, in, rows, cols, steps, &ws);
}

void newton_schulz(double* out, const double* in, int rows, int cols, int steps) {
  std::vector<double> scratch;
  newton_schulz_impl(out, in, rows, cols, steps, &scratch);
}

void newton_schulz_bf16(float* out, const float* in, int count, int rows, int cols, int steps, MuonWorkspace* ws) {
  ATOLL_CHECK(rows > 0 && cols > 0 && count >= 0) << count << "x" << rows << "x" << cols;
  ATOLL_CHECK_GE(steps, 0);
  const bool tall = rows > cols;
  const int m = tall ? cols : rows, n = tall ? rows : cols;
  const size_t mn = size_t(m) * n, mm = size_t(m) * m, all_mn = count * mn, all_mm = count * mm;
  ws->bx.resize(all_mn), ws->bx16.resize(all_mn);
  ws->ba16.resize(all_mm), ws->bb16.resize(all_mm);
  float* x = ws->bx.data();
  bf16 *x16 = ws->bx16.data(), *a16 = ws->ba16.data(), *b16 = ws->bb16.data();

  // X_i = in_i / (||in_i||_F + 1e-7), kept in the input's own orientation: for a tall X [n, m]
  // the iteration is mirrored (A = Xt X, X = a X + X B), the same polynomial on the same
  // singular values, so no transposed copies are made (they cost as much as a product here).
  std::vector<double> scale(count);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < count; ++i) {
    double sumsq = 0.0;
    const float* src = in + i * mn;
    for (size_t k = 0; k < mn; ++k) sumsq += double(src[k]) * double(src[k]);
    scale[i] = 1.0 / (std::sqrt(sumsq) + 1e-7);
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (int i = 0; i < count; ++i)
    for (int r = 0; r < rows; ++r) {
      const size_t at = i * mn + size_t(r) * cols;
      const float sc = float(scale[i]);
      for (int c = 0; c < cols; ++c) x[at + c] = in[at + c] * sc;
    }
  to_bf16(x16, x, all_mn);

  const int ld = cols;  // X's leading dimension in either orientation
  for (int s = 0; s < steps; ++s) {
    // A = X Xt (wide) or Xt X (tall);  B = b A + c A A;  X = a X + B X (wide) or a X + X B (tall).
    // A and B exist only in bf16 (each rounded once, straight from the fp32 accumulator; as in
    // Keller Jordan's all-bf16 iteration); X stays fp32, updated in place (the products read
    // only its bf16 copy), so its rounding does not compound across steps.
    gemm_bf16_batched_out(count, tall, !tall, m, m, n, 1.0f, x16, ld, mn, x16, ld, mn, 0.0f, a16, m, mm);
    std::memcpy(b16, a16, all_mm * sizeof(bf16));
    gemm_bf16_batched_out(count, false, false, m, m, m, float(kNsC), a16, m, mm, a16, m, mm, float(kNsB), b16, m, mm);
    if (tall)
      gemm_bf16_batched(count, false, false, n, m, m, 1.0f, x16, ld, mn, b16, m, mm, float(kNsA), x, ld, mn);
    else
      gemm_bf16_batched(count, false, false, m, n, m, 1.0f, b16, m, mm, x16, ld, mn, float(kNsA), x, ld, mn);
    to_bf16(x16, x, all_mn);
  }
  std::memcpy(out, x, all_mn * sizeof(float));
}

namespace {

// Muon on `count` consecutive-in-the-list matrices of one shape with the batched bf16
// Newton-Schulz: momentum and look-ahead into packed U, one newton_schulz_bf16, then the
// update. Every loop is over whole matrices' elements in a fixed order, so results do not
// depend on the thread count beyond oneDNN's own summation order.
void muon_update_group_bf16(float* params, float* momentum, const float* grads, const MuonMatrix* mats, int count,
                            const MuonOptions& opt, MuonWorkspace* ws) {
  const int rows = mats[0].rows, cols = mats[0].cols;
  const size_t n = size_t(rows) * cols;
  ws->bu.resize(count * n);
  float* u = ws->bu.data();
  const float mu = float(opt.momentum);
#pragma omp parallel for collapse(2) schedule(static)
  for (int i = 0; i < count; ++i)
    for (int r = 0; r < rows; ++r) {
      const size_t o = mats[i].offset + size_t(r) * cols;
      float* ui = u + i * n + size_t(r) * cols;
      for (int c = 0; c < cols; ++c) {
        momentum[o + c] = mu * momentum[o + c] + grads[o + c];
        ui[c] = grads[o + c] + mu * momentum[o + c];
      }
    }
  newton_schulz_bf16(u, u, count, rows, cols, opt.ns_steps, ws);
  const float scale = float(opt.lr * 0.2 * std::sqrt(double(std::max(rows, cols))));
#pragma omp parallel for collapse(2) schedule(static)
  for (int i = 0; i < count; ++i)
    for (int r = 0; r < rows; ++r) {
      const float decay = float(1.0 - opt.lr * (mats[i].decay ? opt.weight_decay : 0.0));
      float* p = params + mats[i].offset + size_t(r) * cols;
      const float* ui = u + i * n + size_t(r) * cols;
      for (int c = 0; c < cols; ++c) p[c] = p[c] * decay - scale * ui[c];
    }
}

}  // namespace

void muon_update(float* param, float* momentum, const float* grad, int rows, int cols, const MuonOptions& opt,
                 MuonWorkspace* ws) {
  const size_t n = size_t(rows) * cols;
  if (ws->update.size() < n) ws->update.resize(n);
  float* u = ws->update.data();  // [rows, cols]
  const float mu = float(opt.momentum);
  for (size_t i = 0; i < n; ++i) {
    momentum[i] = mu * momentum[i] + grad[i];
    u[i] = grad[i] + mu * momentum[i];  // Nesterov: look ahead along the momentum
  }
  newton_schulz(u, u, rows, cols, opt.ns_steps, ws);
  // Moonlight's RMS matching: an orthogonal [rows, cols] matrix has RMS 1/sqrt(max(rows,
  // cols)); 0.2*sqrt(max) brings the update to AdamW's typical RMS of 0.2-0.4.
  const float decay = float(1.0 - opt.lr * opt.weight_decay);
  const float scale = float(opt.lr * 0.2 * std::sqrt(double(std::max(rows, cols))));
  for (size_t i = 0; i < n; ++i) param[i] = param[i] * decay - scale * u[i];
}

void muon_update_many(float* params, float* momentum, const float* grads, std::span<const MuonMatrix> mats,
                      const MuonOptions& opt, std::vector<MuonWorkspace>* ws) {
  // Checked here, not inside: an exception cannot leave an OpenMP region.
  ATOLL_CHECK_GE(opt.ns_steps, 0);
  for (const MuonMatrix& mat : mats) ATOLL_CHECK(mat.rows > 0 && mat.cols > 0) << mat.offset;
  const int threads = omp_get_max_threads();
  if (ws->size() < size_t(threads)) ws->resize(threads);
  if (opt.bf16) {
    // Same shapes side by side (stable: layout order within a shape), so that e.g. every
    // layer's wq..wo, or all experts' w1 and w3, share batches.
    std::vector<MuonMatrix> sorted(mats.begin(), mats.end());
    std::stable_sort(sorted.begin(), sorted.end(), [](const MuonMatrix& a, const MuonMatrix& b) {
      return a.rows != b.rows ? a.rows < b.rows : a.cols < b.cols;
    });
    mats = sorted;
    for (size_t i = 0; i < mats.size();) {
      const size_t per = size_t(mats[i].rows) * mats[i].cols;
      const size_t max_count = std::max<size_t>(1, kMuonBatchElements / per);
      size_t j = i + 1;
      while (j < mats.size() && j - i < max_count && mats[j].rows == mats[i].rows && mats[j].cols == mats[i].cols) ++j;
      muon_update_group_bf16(params, momentum, grads, mats.data() + i, int(j - i), opt, &(*ws)[0]);
      i = j;
    }
    return;
  }
  auto one = [&](const MuonMatrix& mat, MuonWorkspace* w) {
    MuonOptions o = opt;
    if (!mat.decay) o.weight_decay = 0.0;
    muon_update(params + mat.offset, momentum + mat.offset, grads + mat.offset, mat.rows, mat.cols, o, w);
  };
  if (threads == 1 || mats.size() < size_t(threads)) {
    for (const MuonMatrix& mat : mats) one(mat, &(*ws)[0]);
    return;
  }
  SingleThreadedBlas blas_one;
  const int64_t count = int64_t(mats.size());
#pragma omp parallel num_threads(threads)
  {
    MuonWorkspace* w = &(*ws)[omp_get_thread_num()];
    // Dynamic: matrices differ in size (attention vs expert); a matrix's result does not
    // depend on which thread runs it.
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; ++i) one(mats[i], w);
  }
}

}  // namespace atl
