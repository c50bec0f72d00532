// Rotary position embedding, "rotate-half" convention (GPT-NeoX, Llama, Mixtral):
// with x = [x1, x2] halves of a head, rope(x) = [x1 cos - x2 sin, x2 cos + x1 sin], where
// angle(t, i) = t * theta^(-2i/HD), i < HD/2.
// Partial rotary (Hugging Face's partial_rotary_factor): only the first RD = rotary_dim
// entries of each head rotate, as a head of RD (halves of RD/2, angle t * theta^(-2i/RD));
// the other HD - RD pass through.
#pragma once

#include <vector>

namespace atl {

// cos/sin tables [T, RD/2], computed in double and rounded once (as Hugging Face does).
// rotary_dim 0 means head_dim (every entry rotates); an odd one leaves its last entry alone.
template <typename T>
struct RopeTable {
  int seq_len = 0, head_dim = 0, rotary_dim = 0;
  std::vector<T> cos, sin;  // [T, RD/2]
  static RopeTable build(int seq_len, int head_dim, double theta, int rotary_dim = 0);
};

// x[B,T,NHX,HD] rotated in place; position t of each sequence uses row pos0 + t of the table
// (pos0 > 0 when decoding one token at a time with a KV cache).
template <typename T>
void rope_forward(T* x, const RopeTable<T>& table, int B, int T_, int NHX, int HD, int pos0 = 0);

// dx[B,T,NHX,HD] in place: the inverse rotation (the map is orthogonal), at the positions
// rope_forward used (pos0 as its).
template <typename T>
void rope_backward(T* dx, const RopeTable<T>& table, int B, int T_, int NHX, int HD, int pos0 = 0);

}  // namespace atl
