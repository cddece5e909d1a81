// Scattered writes of the state of sent elements (one cache line each, far apart in a large
// tensor). Each store misses the caches and the store buffer holds only a few dozen of them, so
// in a plain loop every element waits for its line: 30-40 ns an element at 1% of 16M floats on
// one core here. Asking for the lines a few dozen elements ahead keeps many misses in flight:
// 19 ns (docs/kernels.md).
#pragma once
#include <cstdint>

#include "../kernels/feedback.h"

namespace sparsecomm {
namespace cpu {

constexpr int64_t kPrefetchAhead = 32;

// Asks for the state lines that sending element i writes (feedback.h: `send`).
inline void prefetch_sent_state(const Feedback& fb, int64_t i) {
  if (fb.residual_out) __builtin_prefetch(fb.residual_out + i, 1);
  if (fb.momentum_out && fb.masking) __builtin_prefetch(fb.momentum_out + i, 1);
}

}  // namespace cpu
}  // namespace sparsecomm
