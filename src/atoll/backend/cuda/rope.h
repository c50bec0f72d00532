// Rotary position embedding on the device; semantics of layers/rope.h (rotate-half, pos0).
// Device pointers.
#pragma once

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// The cos/sin tables [seq_len, rotary_dim/2] in device memory: RopeTable<float>'s vectors
// copied over (the CPU builds them in double and rounds once, so both sides use the same values).
// rotary_dim 0 means head_dim; a smaller one rotates only each head's first rotary_dim entries.
struct DeviceRopeTable {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int seq_len = 0, head_dim = 0, rotary_dim = 0;
};

// x[B,T,NHX,HD] rotated in place, position t of each sequence at table row pos0 + t.
// Checks pos0 + T <= seq_len and HD == head_dim (host side, throws CheckError).
void rope_forward(float* x, const DeviceRopeTable& table, int B, int T_, int NHX, int HD, int pos0 = 0,
                  cudaStream_t stream = nullptr);

// dx[B,T,NHX,HD] in place: the inverse rotation, position t at table row pos0 + t.
void rope_backward(float* dx, const DeviceRopeTable& table, int B, int T_, int NHX, int HD, int pos0 = 0,
                   cudaStream_t stream = nullptr);

}  // namespace atl::gpu
