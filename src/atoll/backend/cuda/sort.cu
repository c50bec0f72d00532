#include "atoll/backend/cuda/sort.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"
#include "atoll/core/check.h"

namespace atl::gpu {
namespace {

constexpr int kSortThreads = 256;
constexpr int kDigitBits = 4;
constexpr int kDigits = 1 << kDigitBits;

__global__ void __launch_bounds__(kSortThreads)
    radix_sort_kernel(int32_t* sorted_keys, int32_t* order, const int32_t* keys, int n, int passes, int32_t* k0,
                      int32_t* k1, int32_t* i0, int32_t* i1) {
  __shared__ int slot[kDigits * kSortThreads];  // [digit][thread]
  const int t = threadIdx.x;
  const int chunk = (n + kSortThreads - 1) / kSortThreads;
  const int lo = min(n, t * chunk), hi = min(n, lo + chunk);
  for (int p = 0; p < passes; ++p) {
    const bool first = p == 0, last = p == passes - 1;
    const int32_t* src_k = first ? keys : (p & 1 ? k0 : k1);
    const int32_t* src_i = first ? nullptr : (p & 1 ? i0 : i1);
    int32_t* dst_k = last ? sorted_keys : (p & 1 ? k1 : k0);
    int32_t* dst_i = last ? order : (p & 1 ? i1 : i0);
    const int shift = p * kDigitBits;
    for (int d = 0; d < kDigits; ++d) slot[d * kSortThreads + t] = 0;
    for (int i = lo; i < hi; ++i) ++slot[((src_k[i] >> shift) & (kDigits - 1)) * kSortThreads + t];
    __syncthreads();
    if (t == 0) {  // exclusive scan, digit-major: 4096 adds, negligible beside the passes
      int run = 0;
      for (int j = 0; j < kDigits * kSortThreads; ++j) {
        const int c = slot[j];
        slot[j] = run;
        run += c;
      }
    }
    __syncthreads();
    for (int i = lo; i < hi; ++i) {
      const int32_t key = src_k[i];
      const int pos = slot[((key >> shift) & (kDigits - 1)) * kSortThreads + t]++;
      dst_k[pos] = key;
      dst_i[pos] = first ? i : src_i[i];
    }
    __syncthreads();  // this pass's global writes are visible to the whole block before the next
  }
}

}  // namespace

void stable_sort_by_key(int32_t* sorted_keys, int32_t* order, const int32_t* keys, int n, int key_limit,
                        int32_t* scratch, cudaStream_t stream) {
  ATOLL_CHECK(n >= 0 && key_limit >= 1) << "n " << n << " key_limit " << key_limit;
  if (n == 0) return;
  int bits = 0;
  while (bits < 31 && (int64_t(1) << bits) < key_limit) ++bits;
  const int passes = bits == 0 ? 1 : (bits + kDigitBits - 1) / kDigitBits;
  int32_t* k0 = scratch;
  int32_t* k1 = k0 + n;
  int32_t* i0 = k1 + n;
  int32_t* i1 = i0 + n;
  radix_sort_kernel<<<1, kSortThreads, 0, stream>>>(sorted_keys, order, keys, n, passes, k0, k1, i0, i1);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
