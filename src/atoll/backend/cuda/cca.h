// Compressed convolutional attention's own steps on the device; semantics, shapes and (=)/(+=)
// contracts of layers/cca.h (the convolutions with their causal padding, the qk-mean skip, the
// q/k norm with the temperature, the value shift), plus the packing of [qp | kp] rows. Device
// pointers, fp32. Every sum runs in a fixed order in one thread (bit-reproducible run to run).
#pragma once

#include "atoll/backend/cuda/vendor.h"
#include "atoll/layers/cca.h"

namespace atl::gpu {

// y[B,TY,CC] (=), z[B,T,CC] (=) from x[B,T,CC]; w0[CC,t0], b0[CC], w1[CC,HD,t1], b1[CC].
void cca_conv_forward(float* z, float* y, const float* x, const float* w0, const float* b0, const float* w1,
                      const float* b1, const CcaDims& d, cudaStream_t stream = nullptr);

// dx[B,T,CC] (+=), dw0, db0, dw1, db1 (+=) from dz; dy[B,TY,CC] is scratch (=).
void cca_conv_backward(float* dx, float* dw0, float* db0, float* dw1, float* db1, float* dy, const float* dz,
                       const float* y, const float* x, const float* w0, const float* w1, const CcaDims& d,
                       cudaStream_t stream = nullptr);

// q[N,QD], k[N,KVD] (=) from z[N,CC] and x[N,CC].
void cca_qk_mean_forward(float* q, float* k, const float* z, const float* x, const CcaDims& d,
                         cudaStream_t stream = nullptr);

// dz[N,CC] (=), dx[N,CC] (+=) from dq[N,QD], dk[N,KVD].
void cca_qk_mean_backward(float* dz, float* dx, const float* dq, const float* dk, const CcaDims& d,
                          cudaStream_t stream = nullptr);

// qn, kn (=), rq[N,NH], rk[N,NKV] (=) from q, k and temp[NKV].
void cca_qk_norm_forward(float* qn, float* kn, float* rq, float* rk, const float* q, const float* k,
                         const float* temp, const CcaDims& d, cudaStream_t stream = nullptr);

// dq, dk (=), dtemp[NKV] (+=); part[N,NKV] is scratch (=).
void cca_qk_norm_backward(float* dq, float* dk, float* dtemp, float* part, const float* dqn, const float* dkn,
                          const float* q, const float* k, const float* rq, const float* rk, const float* temp,
                          const CcaDims& d, cudaStream_t stream = nullptr);

// v[N,KVD] (=) from vc, vd[N,KVD/2]; and back: dvc, dvd (=) from dv.
void cca_value_forward(float* v, const float* vc, const float* vd, const CcaDims& d, cudaStream_t stream = nullptr);
void cca_value_backward(float* dvc, float* dvd, const float* dv, const CcaDims& d, cudaStream_t stream = nullptr);

// out[N, A+Bw] (=) rows of a[N,A] beside rows of b[N,Bw]; unpack_rows the inverse.
void pack_rows(float* out, const float* a, const float* b, int N, int A, int Bw, cudaStream_t stream = nullptr);
void unpack_rows(float* a, float* b, const float* in, int N, int A, int Bw, cudaStream_t stream = nullptr);

}  // namespace atl::gpu
