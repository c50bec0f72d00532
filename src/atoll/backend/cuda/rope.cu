#include "atoll/backend/cuda/rope.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"
#include "atoll/core/check.h"

namespace atl::gpu {
namespace {

// One thread per (b, t, head, i < RD/2) pair of elements; sign = -1 applies the transpose.
// Entries from RD on pass through (partial rotary).
__global__ void rope_kernel(float* x, const float* cos_t, const float* sin_t, int T_, int NHX, int HD, int RD,
                            int pos0, float sign, size_t pairs) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= pairs) return;
  const int half = RD / 2;
  const int i = int(idx % half);
  const size_t row = idx / half;  // (b*T + t)*NHX + h
  const int t = int((row / NHX) % T_);
  const size_t table = size_t(pos0 + t) * half + i;
  const float c = cos_t[table], s = sin_t[table];
  float* v = x + row * HD;
  const float x1 = v[i], x2 = v[i + half];
  v[i] = x1 * c - sign * x2 * s;
  v[i + half] = x2 * c + sign * x1 * s;
}

void rotate(float* x, const DeviceRopeTable& table, int B, int T_, int NHX, int HD, int pos0, float sign,
            cudaStream_t stream) {
  ATOLL_CHECK(pos0 >= 0 && pos0 + T_ <= table.seq_len && HD == table.head_dim)
      << "rope table built for T=" << table.seq_len << " HD=" << table.head_dim << ", asked pos0=" << pos0
      << " T=" << T_ << " HD=" << HD;
  const int RD = table.rotary_dim > 0 ? table.rotary_dim : HD;
  const size_t pairs = size_t(B) * T_ * NHX * (RD / 2);
  if (pairs == 0) return;
  rope_kernel<<<grid_for(pairs), kBlock, 0, stream>>>(x, table.cos, table.sin, T_, NHX, HD, RD, pos0, sign, pairs);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(float* x, const DeviceRopeTable& table, int B, int T_, int NHX, int HD, int pos0,
                  cudaStream_t stream) {
  rotate(x, table, B, T_, NHX, HD, pos0, 1.f, stream);
}

void rope_backward(float* dx, const DeviceRopeTable& table, int B, int T_, int NHX, int HD, int pos0,
                   cudaStream_t stream) {
  rotate(dx, table, B, T_, NHX, HD, pos0, -1.f, stream);
}

}  // namespace atl::gpu
