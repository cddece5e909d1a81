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

}  // namespace cuda
}  // namespace sparsecomm
