// Dispatch and combine for the MoE layer. The N*K (token, slot) pairs are ordered by expert
// (a counting sort, tokens ascending within an expert), so every expert works on one
// contiguous block of rows and no token is ever dropped. A slot of expert id kNoExpert (the
// zaya router's skip class) gets no row: it costs no expert compute and adds 0 to its token.
//   dispatch: xe[r] = x[token of row r]
//   combine:  out[n] = Σ_j w[n,j] * ye[row of (n, j)]   (slots in order: bit-reproducible)
#pragma once

#include <cstdint>
#include <vector>

namespace atl {

// The expert id of a slot that no expert computes (the zaya router's skip class).
inline constexpr int32_t kNoExpert = -1;

struct ExpertRouting {
  std::vector<int32_t> offsets;    // [E+1] first row of each expert; offsets[E] = the rows, N*K less the skipped slots
  std::vector<int32_t> row_token;  // [offsets[E]] token of each row
  std::vector<int32_t> slot_row;   // [N*K] row of (token n, slot j) at n*K + j; -1 for a skipped slot
};

// Builds the routing from topk_idx[N,K] (expert ids in [0, E) or kNoExpert, checked).
void build_routing(ExpertRouting& routing, const int32_t* topk_idx, int N, int E, int K);

// xe[N*K,C] (=).
template <typename T>
void dispatch_forward(T* xe, const T* x, const ExpertRouting& routing, int N, int C, int K);

// dx[N,C] (+=) the rows of dxe[N*K,C] back at their tokens.
template <typename T>
void dispatch_backward(T* dx, const T* dxe, const ExpertRouting& routing, int N, int C, int K);

// out[N,C] (=).
template <typename T>
void combine_forward(T* out, const T* ye, const T* topk_w, const ExpertRouting& routing, int N, int C, int K);

// dye[N*K,C] (=) w * dout; dtopk_w[N,K] (=) dout · ye (0 for a skipped slot).
template <typename T>
void combine_backward(T* dye, T* dtopk_w, const T* dout, const T* ye, const T* topk_w, const ExpertRouting& routing,
                      int N, int C, int K);

}  // namespace atl
