// Launch geometry shared by the CUDA launchers.
#pragma once
#include <cstdint>

namespace sparsecomm {
namespace cuda {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items (at least 1, capped; the loop covers the rest).
inline int grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return int(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

}  // namespace cuda
}  // namespace sparsecomm
