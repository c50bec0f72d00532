#include "atoll/optim/muon.h"

#include <cblas.h>  // OpenBLAS thread control only; products go through backend gemm
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "atoll/backend/cpu/gemm.h"
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
