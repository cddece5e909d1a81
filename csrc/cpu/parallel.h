// Splitting a memory-bound pass over the cores. OpenMP is the runtime torch itself uses
// (torch.set_num_threads sets it); without OpenMP, or for small tensors, one thread.
#pragma once
#include <algorithm>
#include <cstdint>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace sparsecomm {
namespace cpu {

// Below this many elements a pass is too short to pay for waking threads.
constexpr int64_t kParallelMinElements = 1 << 20;
// The same for a pass of scattered accesses (a cache miss per element).
constexpr int64_t kParallelMinScattered = 1 << 15;

inline int pass_threads(int64_t numel) {
#ifdef _OPENMP
  return numel >= kParallelMinElements ? std::max(1, omp_get_max_threads()) : 1;
#else
  (void)numel;
  return 1;
#endif
}

// Calls fn(chunk, begin, end) for `chunks` contiguous chunks of [0, numel), each a multiple
// of `align` elements long (but the last), in parallel.
template <typename Fn>
void for_chunks(int64_t numel, int chunks, int64_t align, Fn fn) {
  const int64_t per = ((numel + chunks - 1) / chunks + align - 1) / align * align;
#ifdef _OPENMP
#pragma omp parallel for num_threads(chunks) schedule(static, 1) if (chunks > 1)
#endif
  for (int c = 0; c < chunks; ++c) {
    const int64_t begin = std::min(numel, c * per), end = std::min(numel, begin + per);
    fn(c, begin, end);
  }
}

}  // namespace cpu
}  // namespace sparsecomm
