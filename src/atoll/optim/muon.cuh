// Muon on the device: the Newton-Schulz orthogonalisation and the update of optim/muon.h,
// with the matrix products through the BLAS wrapper (fp32 in, fp32 accumulation) and the
// same sequence of operations as the CPU, so results agree to fp32 rounding. Device pointers.
#pragma once

#include <cstdint>

#include "atoll/backend/cuda/blas.h"
#include "atoll/backend/cuda/vendor.h"
#include "atoll/optim/muon.h"

namespace atl::gpu {

// out[rows, cols] (=) NewtonSchulz5(in[rows, cols]) after `steps` iterations (kNsA, kNsB, kNsC),
// on the wide orientation; out may be in. Runs on blas.stream(). scratch:
// newton_schulz_scratch_floats(rows, cols) floats, 8-byte aligned (the arena's are).
void newton_schulz(float* out, const float* in, int rows, int cols, int steps, Blas& blas, float* scratch);
int64_t newton_schulz_scratch_floats(int rows, int cols);

// One Muon step on one matrix: param and momentum [rows, cols] in place, grad read.
// scratch: muon_scratch_floats(rows, cols) floats, 8-byte aligned.
void muon_update(float* param, float* momentum, const float* grad, int rows, int cols, const MuonOptions& opt,
                 Blas& blas, float* scratch);
int64_t muon_scratch_floats(int rows, int cols);

}  // namespace atl::gpu
