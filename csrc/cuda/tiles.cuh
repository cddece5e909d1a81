// The block-level steps of the selection kernels, written once for the tensor-at-a-time kernels
// (select.cu) and the bucket-at-a-time ones (segments.cu): a tile's state pass and count, its
// ordered compaction, and the digits of the radix select. Device functions only: no launches.
#pragma once
#include "../kernels/feedback.h"
#include "../kernels/quantize.h"
#include "grid.cuh"
#include "launchers.h"

namespace sparsecomm {
namespace cuda {

constexpr int kItems = int(kCandidateTile / kThreads);  // elements per thread in a tile

// The rank-th largest of n non-negative floats (inf allowed): their bit patterns order like
// the values, so a most-significant-digit-first radix select over 4 bytes finds it exactly.
// The sign bit is cleared first: magnitude(-0.0f) is -0.0f, which must order as 0, not above inf.
// Each digit takes two launches: every block counts its share of the values that match the
// digits chosen so far (add_digits), then one thread picks the next digit (choose_digit). In one
// block, the shared atomics serialised on the few digits gradients share (kernels.md, "On a GPU").
static_assert(sizeof(SelectState) + alignof(SelectState) <= kSelectStateFloats * sizeof(float));
constexpr int kSelectItems = 16;  // values per thread: few blocks, so few global atomics per digit
static_assert(kDigitBlockItems == kThreads * kSelectItems);

// A block of 256 threads: state's histogram cleared, the rank to find set.
__device__ inline void start_select(SelectState* state, int64_t rank) {
  state->histogram[threadIdx.x] = 0;
  if (threadIdx.x == 0) {
    state->prefix = 0;
    state->remaining = rank;
  }
}

// A block of 256 threads adds the digits of value(j) for j in [begin, end) (by a grid-stride of
// `step`) that match the prefix to state's histogram.
template <typename Value>
__device__ void add_digits(int64_t begin, int64_t end, int64_t step, int shift, SelectState* state, Value value) {
  __shared__ int histogram[256];
  histogram[threadIdx.x] = 0;  // blockDim.x == 256
  __syncthreads();
  const uint32_t mask = shift == 24 ? 0u : ~0u << (shift + 8), prefix = state->prefix;
  for (int64_t j = begin + threadIdx.x; j < end; j += step) {
    const uint32_t bits = float_bits(value(j)) & 0x7fffffffu;
    if ((bits & mask) == prefix) atomicAdd(&histogram[(bits >> shift) & 255], 1);
  }
  __syncthreads();
  if (histogram[threadIdx.x] != 0) atomicAdd(&state->histogram[threadIdx.x], histogram[threadIdx.x]);
}

// The digit holding the rank-th largest, counting from the top (one thread); clears the
// histogram for the next digit, and after the last one writes the threshold.
__device__ inline void choose_digit(int shift, SelectState* state, float* out) {
  int64_t remaining = state->remaining;
  int d = 255;
  for (; d > 0 && state->histogram[d] < remaining; --d) remaining -= state->histogram[d];
  state->prefix |= uint32_t(d) << shift;
  state->remaining = remaining;
  for (int i = 0; i < 256; ++i) state->histogram[i] = 0;
  if (shift == 0) *out = bits_float(state->prefix);
}

// A block's tile of kCandidateTile elements from `first`: acc(i) for each (the state pass,
// which writes the state), returning the number selected at threshold t (every thread gets it).
template <typename Acc>
__device__ int count_tile(int64_t first, int64_t numel, float t, Acc acc) {
  __shared__ int count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  int mine = 0;
  for (int item = 0; item < kItems; ++item) {  // coalesced: consecutive threads, consecutive elements
    const int64_t i = first + item * kThreads + threadIdx.x;
    if (i >= numel) break;
    mine += selected(acc(i), t) ? 1 : 0;
  }
  atomicAdd(&count, mine);
  __syncthreads();
  const int total = count;
  __syncthreads();  // (a block's next tile clears it)
  return total;
}

// How many threads of the block before this one (in thread order) have `take`, and (row_total)
// how many in all: warp ballots, then warp offsets. Every thread of the block calls it.
__device__ inline int ordered_offset(bool take, int* row_total) {
  __shared__ int warp_totals[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, take);
  if (lane == 0) warp_totals[warp] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << lane) - 1u)), total = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) before += warp_totals[w];
    total += warp_totals[w];
  }
  __syncthreads();  // (the next call writes warp_totals again)
  *row_total = total;
  return before;
}

// A block's tile from `first`: the elements of source(i) selected at t, in index order, to
// acc_out / index_out from `written` on.
template <typename Source>
__device__ void compact_tile(int64_t first, int64_t numel, float t, int64_t written, Source source, float* acc_out,
                             int32_t* index_out) {
  for (int item = 0; item < kItems; ++item) {
    const int64_t i = first + item * kThreads + threadIdx.x;
    const float acc = i < numel ? source(i) : 0.0f;
    const bool take = i < numel && selected(acc, t);
    int row_total;
    const int before = ordered_offset(take, &row_total);
    if (take) {
      acc_out[written + before] = acc;
      index_out[written + before] = int32_t(i);
    }
    written += row_total;
  }
}

// The sum of every thread's v, added pairwise (thread j += thread j + h for h = blockDim / 2, ...,
// 1): a fixed order, whatever the grid (squares.h's pairwise_lanes for blocks of kSquareLanes).
__device__ inline double block_sum(double v, double* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) scratch[threadIdx.x] += scratch[threadIdx.x + stride];
    __syncthreads();
  }
  const double total = scratch[0];
  __syncthreads();
  return total;
}

// send_quantized by one block of kQuantThreads threads, in a fixed order of addition (the same
// scales on every run, for one tensor at a time or a bucket's): the mean |v| that splits the 2-bit
// classes, each class's mean, then the codes and the state. scratch: kQuantThreads doubles of
// shared memory, scale: 4 floats of it.
constexpr int kQuantThreads = 512;
__device__ inline void quantize_block(const float* acc, const int32_t* index, int64_t count, const Feedback& fb,
                                      int bits, uint8_t* codes, float* scales, double* scratch, float* scale) {
  double abs_sum = 0.0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) abs_sum += fabs(acc[j]);
  const double total_abs = block_sum(abs_sum, scratch);
  const float split = count ? float(total_abs / double(count)) : 0.0f;
  for (int c = 0; c < quantized_scales(bits); ++c) {
    double sum = 0.0, n = 0.0;
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x)
      if (quantize_code(acc[j], bits, split) == uint32_t(c)) {
        sum += acc[j];
        n += 1.0;
      }
    const double class_sum = block_sum(sum, scratch), class_n = block_sum(n, scratch);
    if (threadIdx.x == 0) scale[c] = class_n > 0.0 ? float(class_sum / class_n) : 0.0f;
  }
  __syncthreads();
  if (threadIdx.x < quantized_scales(bits)) scales[threadIdx.x] = scale[threadIdx.x];
  const int64_t per_byte = 8 / bits;
  for (int64_t b = threadIdx.x; b < quantized_bytes(count, bits); b += blockDim.x) {
    uint32_t byte = 0;
    for (int64_t j = b * per_byte; j < count && j < (b + 1) * per_byte; ++j) {
      const uint32_t code = quantize_code(acc[j], bits, split);
      byte |= code << ((j * bits) & 7);
      const float left = acc[j] - scale[code];
      if (fb.residual_out) fb.residual_out[index[j]] = finite_or_zero(left);
      if (fb.momentum_out && fb.masking) fb.momentum_out[index[j]] = 0.0f;
    }
    codes[b] = uint8_t(byte);
  }
}

}  // namespace cuda
}  // namespace sparsecomm
