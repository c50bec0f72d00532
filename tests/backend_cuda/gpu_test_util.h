// Helpers for the GPU kernel tests: skip without a device, move vectors to and from the
// device, and compare against the CPU reference with a stated tolerance.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/vendor.h"
#include "atoll/core/check.h"
#include "atoll/core/rng.h"

namespace atl::test {

// True when a CUDA device is usable; otherwise `why` says what cudaGetDeviceCount reported.
inline bool gpu_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    (void)cudaGetLastError();  // clear the sticky error
    return false;
  }
  if (count == 0) {
    *why = "cudaGetDeviceCount found 0 devices";
    return false;
  }
  return true;
}

// First statement of every GPU test.
#define ATOLL_SKIP_WITHOUT_GPU()                                                                    \
  do {                                                                                              \
    std::string atoll_why_;                                                                         \
    if (!::atl::test::gpu_available(&atoll_why_)) GTEST_SKIP() << "no CUDA device: " << atoll_why_; \
  } while (0)

// A device copy of a host vector (or n uninitialised elements), freed on scope exit.
template <typename T>
class DeviceVec {
 public:
  explicit DeviceVec(size_t n) : n_(n) {
    if (n_) ATOLL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
  }
  explicit DeviceVec(const std::vector<T>& h) : DeviceVec(h.size()) { upload(h); }
  ~DeviceVec() {
    if (p_) (void)cudaFree(p_);
  }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;

  void upload(const std::vector<T>& h) {
    ASSERT_EQ(h.size(), n_);
    if (n_) ATOLL_CUDA_CHECK(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    if (n_) ATOLL_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void fill_nan() {  // poison outputs that must be overwritten (=)
    if (n_) ATOLL_CUDA_CHECK(cudaMemset(p_, 0xff, n_ * sizeof(T)));
  }
  T* get() { return p_; }
  const T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> randn_f(Rng& rng, size_t n, double scale = 1.0) {
  std::vector<float> v(n);
  for (auto& x : v) x = float(scale * rng.normal());
  return v;
}

// Inputs and next-token targets of B sequences with learnable structure: each token is a fixed
// function of the previous one most of the time, so a few steps lower the loss.
struct Batch {
  std::vector<int32_t> in, tg;
};
inline Batch make_batch(Rng& rng, int B, int T, int V) {
  Batch b;
  for (int s = 0; s < B; ++s) {
    int32_t t = int32_t(rng.below(uint64_t(V)));
    for (int i = 0; i <= T; ++i) {
      if (i < T) b.in.push_back(t);
      if (i > 0) b.tg.push_back(t);
      t = rng.uniform() < 0.8 ? int32_t((t * 7 + 3) % V) : int32_t(rng.below(uint64_t(V)));
    }
  }
  return b;
}

inline std::vector<int32_t> randint_ids(Rng& rng, size_t n, int limit) {
  std::vector<int32_t> v(n);
  for (auto& x : v) x = int32_t(rng.below(uint64_t(limit)));
  return v;
}

// |got − want| <= atol + rtol·|want| element by element; reports the first few failures.
inline void expect_near(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                        const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 5; ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    if (!(err <= atol + rtol * std::fabs(double(want[i])))) {
      ADD_FAILURE() << what << "[" << i << "]: gpu " << got[i] << " vs cpu " << want[i] << " (err " << err << ")";
      ++failures;
    }
  }
}

inline void expect_equal(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  expect_near(got, want, 0.0, 0.0, what);
}

}  // namespace atl::test
