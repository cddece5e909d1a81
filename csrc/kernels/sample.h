// Where the threshold sample is taken (DGC / gradient dropping estimate the magnitude
// threshold from a sample instead of sorting the whole tensor).
//
// count positions  offset + j * stride,  j < count,  with an odd stride (a power-of-two stride
// would alias with the power-of-two structure of many weight tensors) and an offset drawn from
// the selection stream (draw 1), so successive steps sample different elements.
#pragma once
#include "philox.h"

namespace sparsecomm {

struct SamplePlan {
  int64_t count = 0, stride = 1, offset = 0;
  int64_t rank = 0;  // the threshold is the rank-th largest sampled magnitude (1-based)
};

// sample_count: wanted number of samples (clamped to [1, numel]); ratio: wanted density.
SC_HOST_DEVICE SamplePlan plan_sample(int64_t numel, int64_t sample_count, double ratio, uint64_t seed,
                                      uint32_t tensor_id, uint64_t step) {
  SamplePlan p;
  if (numel <= 0) return p;
  p.count = sample_count < 1 ? 1 : (sample_count > numel ? numel : sample_count);
  p.stride = numel / p.count;
  if (p.stride > 1 && p.stride % 2 == 0) p.stride -= 1;
  if (p.stride > 1) p.offset = int64_t(selection_random64(seed, tensor_id, step, 1) % uint64_t(p.stride));
  // count * stride <= numel and offset < stride, so every position is inside the tensor.
  double r = ratio * double(p.count);
  p.rank = int64_t(r);
  if (double(p.rank) < r) p.rank += 1;  // ceil
  if (p.rank < 1) p.rank = 1;
  if (p.rank > p.count) p.rank = p.count;
  return p;
}

}  // namespace sparsecomm
