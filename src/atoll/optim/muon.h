// Muon: momentum SGD whose update for each hidden 2-D matrix is orthogonalised by a quintic
// Newton-Schulz iteration (Keller Jordan, https://kellerjordan.github.io/posts/muon/), in the
// Moonlight variant (Liu et al., "Muon is Scalable for LLM Training",
// https://arxiv.org/abs/2502.16982): decoupled weight decay and an update scaled by
// 0.2*sqrt(max(rows, cols)) so that its RMS matches AdamW's and one learning rate serves both.
// Per matrix G [rows, cols]:
//   buf = mu*buf + G;  U = G + mu*buf (Nesterov);  O = NewtonSchulz5(U)
//   p  *= 1 - lr*wd;   p -= lr * 0.2*sqrt(max(rows, cols)) * O
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace atl {

struct MuonOptions {
  double lr = 1e-3;
  double momentum = 0.95;  // mu
  double weight_decay = 0.0;
  int ns_steps = 5;
};

// Scratch for one matrix at a time. The buffers grow to the largest matrix seen and are then
// reused, so steady-state steps allocate nothing. One per thread.
struct MuonWorkspace {
  std::vector<float> update;  // U, then O: [rows, cols]
  std::vector<float> ns;      // Newton-Schulz: X, X' [m, n] and A, B [m, m], m = min(rows, cols)
};

// The coefficients (a, b, c) of the quintic X <- a X + b (X Xt) X + c (X Xt)^2 X, chosen by
// Keller Jordan to push every singular value in (0, 1] towards [0.7, 1.2] in a few steps.
inline constexpr double kNsA = 3.4445, kNsB = -4.7750, kNsC = 2.0315;

// out [rows, cols] = NewtonSchulz5(in [rows, cols]) after `steps` iterations: X = in/(||in||_F
// + 1e-7), iterated on the wide orientation (the transpose when rows > cols) so that the Gram
// matrix A = X Xt is the small one. out may be the same buffer as in.
void newton_schulz(float* out, const float* in, int rows, int cols, int steps, MuonWorkspace* ws);
// Same, with a workspace private to the calling thread.
void newton_schulz(float* out, const float* in, int rows, int cols, int steps);
// Same in double (allocates; a reference for tests).
void newton_schulz(double* out, const double* in, int rows, int cols, int steps);

// One Muon step on one matrix: param and momentum [rows, cols] updated in place, grad read.
void muon_update(float* param, float* momentum, const float* grad, int rows, int cols, const MuonOptions& opt,
                 MuonWorkspace* ws);

// One matrix of a flat buffer: an attention weight, or one expert of an [E, rows, cols] tensor.
struct MuonMatrix {
  size_t offset = 0;  // in elements, into params, momentum and grads alike
  int rows = 0;
  int cols = 0;
  bool decay = true;  // takes weight decay
};

// Muon steps on independent matrices of the flat buffers. With at least as many matrices as
// OpenMP threads, each thread takes whole matrices with single-threaded BLAS; otherwise the
// matrices go one after another with threaded BLAS. Either way a matrix's result comes from
// one fixed sequence of operations, so it does not depend on scheduling. `ws` is resized to
// the thread count.
void muon_update_many(float* params, float* momentum, const float* grads, std::span<const MuonMatrix> mats,
                      const MuonOptions& opt, std::vector<MuonWorkspace>* ws);

}  // namespace atl
