// Where the threshold sample is taken (DGC / gradient dropping estimate the magnitude
// threshold from a sample instead of sorting the whole tensor).
//
// The sample is `runs` runs of `run` consecutive elements (one 64-byte line of float32: 16x
// less memory traffic than single elements for the same sample size), run r starting at
// offset + r * stride. The stride is odd (a power-of-two stride would alias with the
// power-of-two structure of many weight tensors) and the offset comes from the selection
// stream (draw 1), so successive steps sample different elements. A tensor too small for
// runs is sampled element by element.
#pragma once
#include "philox.h"

namespace sparsecomm {

struct SamplePlan {
  int64_t runs = 0, run = 1, stride = 1, offset = 0;
  int64_t count = 0;  // runs * run sampled elements
  int64_t rank = 0;   // the threshold is the rank-th largest sampled magnitude (1-based)
  SC_HOST_DEVICE int64_t position(int64_t j) const { return offset + (j / run) * stride + j % run; }
};

constexpr int64_t kSampleRun = 16;

// sample_count: wanted number of samples (clamped to [1, numel]); ratio: wanted density.
SC_HOST_DEVICE SamplePlan plan_sample(int64_t numel, int64_t sample_count, double ratio, uint64_t seed,
                                      uint32_t tensor_id, uint64_t step) {
  SamplePlan p;
  if (numel <= 0) return p;
  const int64_t wanted = sample_count < 1 ? 1 : (sample_count > numel ? numel : sample_count);
  p.run = numel / wanted >= 2 * kSampleRun ? kSampleRun : 1;  // runs only where they stay sparse
  p.runs = (wanted + p.run - 1) / p.run;
  p.stride = numel / p.runs;
  if (p.stride > p.run && p.stride % 2 == 0) p.stride -= 1;
  const int64_t slack = p.stride - p.run;  // offsets in [0, slack] keep every run inside the tensor
  if (slack > 0) p.offset = int64_t(selection_random64(seed, tensor_id, step, 1) % uint64_t(slack + 1));
  p.count = p.runs * p.run;
  // (runs - 1) * stride + offset + run <= runs * stride <= numel: every position is inside.
  double r = ratio * double(p.count);
  p.rank = int64_t(r);
  if (double(p.rank) < r) p.rank += 1;  // ceil
  if (p.rank < 1) p.rank = 1;
  if (p.rank > p.count) p.rank = p.count;
  return p;
}

}  // namespace sparsecomm
