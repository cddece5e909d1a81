// Launch geometry and launch checking shared by the CUDA launchers.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

// The grid cap of grid_for. Tests lower it (-DSC_MAX_BLOCKS=3) so that small inputs run the
// grid-stride loops; production builds keep the default.
#ifndef SC_MAX_BLOCKS
#define SC_MAX_BLOCKS (65535 * 8)
#endif

namespace sparsecomm {
namespace cuda {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items (at least 1, capped; the loop covers the rest).
inline int grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return int(blocks < SC_MAX_BLOCKS ? (blocks > 0 ? blocks : 1) : SC_MAX_BLOCKS);
}

// Called right after every launch: a bad launch (configuration, resources, or an earlier
// asynchronous error) becomes an exception naming the kernel instead of a silent no-op.
inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("CUDA launch of ") + kernel + " failed: " + cudaGetErrorString(err));
}

// The segment of a table (a bucket's tensors, ascending `at`) holding item j: the last one whose
// first item at(segment) is at or before j. (Empty segments share their successor's `at`.)
template <typename S, typename At>
__device__ int64_t segment_of(const S* segments, int64_t n, int64_t j, At at) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (at(segments[mid]) <= j)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo - 1;
}

}  // namespace cuda
}  // namespace sparsecomm
