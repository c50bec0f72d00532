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
#include <cstdint>
#include <span>
#include <vector>

namespace atl {

struct MuonOptions {
  double lr = 1e-3;
  double momentum = 0.95;  // mu
  double weight_decay = 0.0;
  int ns_steps = 5;
  // Newton-Schulz products in bf16 with fp32 accumulation, batched over same-shape matrices
  // (newton_schulz_bf16); the reference Muon runs the whole iteration in bf16.
  bool bf16 = false;
};

// Scratch for one matrix at a time. The buffers grow to the largest matrix seen and are then
// reused, so steady-state steps allocate nothing. One per thread.
struct MuonWorkspace {
  std::vector<float> update;  // U, then O: [rows, cols]
  std::vector<float> ns;      // Newton-Schulz: X, X' [m, n] and A, B [m, m], m = min(rows, cols)
  // Batched bf16 Newton-Schulz: X [count, m, n] in fp32 and bf16, A and B [count, m, m] in
  // bf16, and the packed updates U [count, rows, cols] of muon_update_many.
  std::vector<float> bx, bu;
  std::vector<uint16_t> bx16, ba16, bb16;
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

// Newton-Schulz on `count` matrices of one shape at once: in, out [count, rows, cols] (out may
// be in). Each product is one batched oneDNN bf16 matmul over all matrices (fp32
// accumulation); A = X Xt and B are produced in bf16 directly; X is kept in fp32 between
// steps and rounded to bf16 for each product, so its rounding does not compound across steps. Agrees with the fp32 iteration to ~1e-2 relative
// (bf16's 2^-8 per product, amplified a few times by the polynomial; muon_test.cc).
void newton_schulz_bf16(float* out, const float* in, int count, int rows, int cols, int steps, MuonWorkspace* ws);

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

// Muon steps on independent matrices of the flat buffers. With opt.bf16, consecutive matrices
// of the same shape go through newton_schulz_bf16 together, in batches of up to
// kMuonBatchElements elements, on all threads (ws[0] holds the scratch). Otherwise: with at least as many matrices as
// OpenMP threads, each thread takes whole matrices with single-threaded BLAS; otherwise the
// matrices go one after another with threaded BLAS. Either way a matrix's result comes from
// one fixed sequence of operations, so it does not depend on scheduling. `ws` is resized to
// the thread count.
inline constexpr size_t kMuonBatchElements = size_t(1) << 22;

void muon_update_many(float* params, float* momentum, const float* grads, std::span<const MuonMatrix> mats,
                      const MuonOptions& opt, std::vector<MuonWorkspace>* ws);

}  // namespace atl
