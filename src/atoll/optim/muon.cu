#include "atoll/optim/muon.cuh"

#include <algorithm>
#include <cmath>
#include <utility>

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"
#include "atoll/core/check.h"

namespace atl::gpu {
namespace {

// *sumsq = Σ in[i]², in double as the CPU. One block: a fixed reduction order, and one pass
// over a matrix is cheap beside its five Newton-Schulz iterations.
__global__ void sumsq_kernel(double* sumsq, const float* in, size_t n) {
  __shared__ double buf[kBlock];
  double acc = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) acc += double(in[i]) * double(in[i]);
  acc = block_sum(acc, buf);
  if (threadIdx.x == 0) *sumsq = acc;
}

// x[m, n] = in[rows, cols] / (||in||_F + 1e-7), transposed when tall (rows > cols).
__global__ void normalise_kernel(float* x, const float* in, const double* sumsq, int rows, int cols, bool tall) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(rows) * cols) return;
  const float scale = float(1.0 / (sqrt(*sumsq) + 1e-7));
  const size_t r = i / cols, c = i % cols;
  const size_t n = tall ? rows : cols;
  x[tall ? c * n + r : r * n + c] = in[i] * scale;
}

__global__ void unorient_kernel(float* out, const float* x, int rows, int cols, bool tall) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(rows) * cols) return;
  const size_t r = i / cols, c = i % cols;
  const size_t n = tall ? rows : cols;
  out[i] = x[tall ? c * n + r : r * n + c];
}

// momentum = mu*momentum + grad; u = grad + mu*momentum (Nesterov).
__global__ void muon_momentum_kernel(float* u, float* momentum, const float* grad, size_t n, float mu) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float mo = mu * momentum[i] + grad[i];
  momentum[i] = mo;
  u[i] = grad[i] + mu * mo;
}

__global__ void muon_apply_kernel(float* param, const float* u, size_t n, float decay, float scale) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) param[i] = param[i] * decay - scale * u[i];
}

struct NsLayout {
  int m, n;
  size_t mn, mm;
};
NsLayout ns_layout(int rows, int cols) {
  const bool tall = rows > cols;
  const int m = tall ? cols : rows, n = tall ? rows : cols;
  return {m, n, size_t(m) * n, size_t(m) * m};
}

}  // namespace

int64_t newton_schulz_scratch_floats(int rows, int cols) {
  const NsLayout L = ns_layout(rows, cols);
  return int64_t(2 * L.mn + 2 * L.mm) + 2;  // X, X', A, B, then the norm as one double
}

int64_t muon_scratch_floats(int rows, int cols) {
  // U first, padded to an even count so the Newton-Schulz scratch after it stays 8-byte aligned.
  return (int64_t(rows) * cols + 1) / 2 * 2 + newton_schulz_scratch_floats(rows, cols);
}

void newton_schulz(float* out, const float* in, int rows, int cols, int steps, Blas& blas, float* scratch) {
  ATOLL_CHECK(rows > 0 && cols > 0) << rows << "x" << cols;
  ATOLL_CHECK_GE(steps, 0);
  const bool tall = rows > cols;
  const auto [m, n, mn, mm] = ns_layout(rows, cols);
  cudaStream_t stream = blas.stream();
  float* x = scratch;                                 // X  [m, n]
  float* y = x + mn;                                  // X' [m, n]
  float* a = y + mn;                                  // A = X Xt [m, m]
  float* b = a + mm;                                  // B = b A + c A A [m, m]
  double* sumsq = reinterpret_cast<double*>(b + mm);  // after 2mn + 2mm floats: 8-byte aligned
  sumsq_kernel<<<1, kBlock, 0, stream>>>(sumsq, in, mn);
  ATOLL_CUDA_CHECK_LAUNCH();
  normalise_kernel<<<grid_for(mn), kBlock, 0, stream>>>(x, in, sumsq, rows, cols, tall);
  ATOLL_CUDA_CHECK_LAUNCH();
  for (int s = 0; s < steps; ++s) {
    blas.gemm(false, true, m, m, n, 1.f, x, n, x, n, 0.f, a, m);  // A = X Xt
    ATOLL_CUDA_CHECK(cudaMemcpyAsync(b, a, mm * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    blas.gemm(false, false, m, m, m, float(kNsC), a, m, a, m, float(kNsB), b, m);  // B = b A + c A A
    ATOLL_CUDA_CHECK(cudaMemcpyAsync(y, x, mn * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    blas.gemm(false, false, m, n, m, 1.f, b, m, x, n, float(kNsA), y, n);  // X' = a X + B X
    std::swap(x, y);
  }
  unorient_kernel<<<grid_for(mn), kBlock, 0, stream>>>(out, x, rows, cols, tall);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void muon_update(float* param, float* momentum, const float* grad, int rows, int cols, const MuonOptions& opt,
                 Blas& blas, float* scratch) {
  ATOLL_CHECK(rows > 0 && cols > 0) << rows << "x" << cols;
  const size_t n = size_t(rows) * cols;
  cudaStream_t stream = blas.stream();
  float* u = scratch;  // [rows, cols]
  float* ns = scratch + (n + 1) / 2 * 2;
  muon_momentum_kernel<<<grid_for(n), kBlock, 0, stream>>>(u, momentum, grad, n, float(opt.momentum));
  ATOLL_CUDA_CHECK_LAUNCH();
  newton_schulz(u, u, rows, cols, opt.ns_steps, blas, ns);
  // Moonlight's RMS matching, as optim/muon.cc: 0.2*sqrt(max(rows, cols)).
  const float decay = float(1.0 - opt.lr * opt.weight_decay);
  const float scale = float(opt.lr * 0.2 * std::sqrt(double(std::max(rows, cols))));
  muon_apply_kernel<<<grid_for(n), kBlock, 0, stream>>>(param, u, n, decay, scale);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
