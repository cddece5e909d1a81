// CUDA launchers for a bucket's sampled packs (launchers.h, "segments.cu"): the kernels of
// select.cu, each launched once for every tensor of the bucket over a table of segments, so that
// a bucket takes the same launches whatever its number of tensors. Each tensor keeps its own
// plan, threshold, state and output: the bits of its tensor-at-a-time kernels. Nothing here
// synchronises with the host.
#include <type_traits>

#include "grid.cuh"
#include "launchers.h"
#include "tiles.cuh"

namespace sparsecomm {
namespace cuda {
namespace {

// f called with a null pointer of the storage type of `type` (its tag).
template <typename F>
__device__ void on_type(FloatType type, F f) {
  switch (type) {
    case FloatType::kFloat16:
      f(static_cast<half16*>(nullptr));
      break;
    case FloatType::kBFloat16:
      f(static_cast<bfloat16*>(nullptr));
      break;
    default:
      f(static_cast<float*>(nullptr));
  }
}

template <typename T>
using Storage = typename std::remove_pointer<T>::type;

// f called with segment g's gradient as a pointer to its storage type.
template <typename F>
__device__ void with_grad(const Segment& g, F f) {
  on_type(g.grad_type, [&](auto tag) { f(static_cast<const Storage<decltype(tag)>*>(g.grad)); });
}

__global__ void gather_samples_kernel(const Segment* segments, int64_t n, int64_t samples, float* sample) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < samples; j += int64_t(gridDim.x) * blockDim.x) {
    const Segment& s = segments[segment_of(segments, n, j, [](const Segment& g) { return g.sample_at; })];
    with_grad(s, [&](const auto* grad) {
      float u;
      sample[j] = magnitude(accumulated(grad, s.fb, s.plan.position(j - s.sample_at), &u));
    });
  }
}

// A block per segment: its select started, or its fixed threshold written where nothing is sampled.
__global__ void start_segments_kernel(const Segment* segments, int64_t n, SelectState* states, float* thresholds) {
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
    start_select(&states[s], segments[s].plan.rank);
    if (threadIdx.x == 0 && segments[s].plan.count == 0) thresholds[s] = segments[s].fixed;
  }
}

// Digit block b counts kDigitBlockItems samples of its segment.
__global__ void digit_segments_kernel(const Segment* segments, int64_t n, int64_t blocks, const float* sample,
                                      int shift, SelectState* states) {
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {  // (the same b for the whole block)
    const int64_t s = segment_of(segments, n, b, [](const Segment& g) { return g.block_at; });
    const Segment& g = segments[s];
    const int64_t begin = g.sample_at + (b - g.block_at) * kDigitBlockItems, last = g.sample_at + g.plan.count;
    add_digits(begin, begin + kDigitBlockItems < last ? begin + kDigitBlockItems : last, kThreads, shift, &states[s],
               [&](int64_t j) { return sample[j]; });
  }
}

__global__ void choose_segments_kernel(const Segment* segments, int64_t n, int shift, SelectState* states,
                                       float* thresholds) {
  for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s < n; s += int64_t(gridDim.x) * blockDim.x)
    if (segments[s].plan.count > 0) choose_digit(shift, &states[s], &thresholds[s]);
}

__device__ const Segment& tile_segment(const Segment* segments, int64_t n, int64_t t, int64_t* s) {
  *s = segment_of(segments, n, t, [](const Segment& g) { return g.tile_at; });
  return segments[*s];
}

__global__ void count_segments_kernel(const Segment* segments, int64_t n, int64_t tiles, const float* thresholds,
                                      int32_t* tile_counts) {
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {  // (the same t for the whole block)
    int64_t s;
    const Segment& g = tile_segment(segments, n, t, &s);
    with_grad(g, [&](const auto* grad) {
      const int count = count_tile((t - g.tile_at) * kCandidateTile, g.numel, thresholds[s], [&](int64_t i) {
        float u;
        const float acc = accumulated(grad, g.fb, i, &u);
        keep(g.fb, i, acc, u);
        return acc;
      });
      if (threadIdx.x == 0) tile_counts[t] = count;
    });
  }
}

__device__ int64_t candidates_before(const int64_t* inclusive, int64_t tile) {
  return tile > 0 ? inclusive[tile - 1] : 0;
}

__global__ void segment_totals_kernel(const Segment* segments, int64_t n, const int64_t* inclusive, int64_t* totals) {
  for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s < n; s += int64_t(gridDim.x) * blockDim.x) {
    const int64_t first = segments[s].tile_at, end = first + candidate_tiles(segments[s].numel);
    totals[s] = candidates_before(inclusive, end) - candidates_before(inclusive, first);
  }
}

// acc is read back from the tensor that now holds it (feedback.h): residual, momentum or grad.
__global__ void compact_segments_kernel(const Segment* segments, int64_t n, int64_t tiles, const float* thresholds,
                                        const int32_t* tile_counts, const int64_t* inclusive, const int64_t* totals,
                                        float* acc, int32_t* index) {
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {  // (the same t for the whole block)
    int64_t s;
    const Segment& g = tile_segment(segments, n, t, &s);
    const int64_t first = (t - g.tile_at) * kCandidateTile;
    int64_t written = inclusive[t] - tile_counts[t];
    if (g.room_at >= 0) {  // fixed capacity: its own room, if they fit
      if (totals[s] > g.room) continue;
      written = g.room_at + written - candidates_before(inclusive, g.tile_at);
    }
    const float* state = g.fb.residual_out ? g.fb.residual_out : g.fb.momentum_out;
    if (state) {
      compact_tile(first, g.numel, thresholds[s], written, [&](int64_t i) { return state[i]; }, acc, index);
      continue;
    }
    with_grad(g, [&](const auto* grad) {
      compact_tile(first, g.numel, thresholds[s], written, [&](int64_t i) { return to_float(grad[i]); }, acc, index);
    });
  }
}

// The min(count, k) of largest magnitude of acc(j), j < count, in input order, written to
// acc_top and index_top (index(j) each): the magnitude v of the k-th largest (its bits: the
// select's prefix), then every one above v and the first `remaining` at v. Returns how many.
template <typename Acc, typename Index>
__device__ int64_t top_of(int64_t count, int64_t k, Acc acc, Index index, float* acc_top, int32_t* index_top,
                          SelectState* state) {
  if (k >= count) {
    for (int64_t j = threadIdx.x; j < count; j += kThreads) acc_top[j] = acc(j), index_top[j] = index(j);
    return count;
  }
  if (k <= 0) return 0;
  const auto bits = [&](int64_t j) { return float_bits(magnitude(acc(j))) & 0x7fffffffu; };
  start_select(state, k);
  __syncthreads();
  for (int shift = 24; shift >= 0; shift -= 8) {
    add_digits(0, count, kThreads, shift, state, [&](int64_t j) { return magnitude(acc(j)); });
    __syncthreads();
    float unused;
    if (threadIdx.x == 0) choose_digit(shift, state, &unused);
    __syncthreads();
  }
  const uint32_t v = state->prefix;
  const int64_t at_v = state->remaining;  // (the first at_v equal to v are in the top k)
  __syncthreads();                        // (read by every thread before the next segment's start)
  int64_t seen_at_v = 0, written = 0;
  for (int64_t row = 0; row < count; row += kThreads) {
    const int64_t j = row + threadIdx.x;
    const uint32_t b = j < count ? bits(j) : 0u;
    int row_at_v, row_taken;
    const bool equal = j < count && b == v;
    const int64_t before_at_v = seen_at_v + ordered_offset(equal, &row_at_v);
    const bool take = j < count && (b > v || (equal && before_at_v < at_v));
    const int before = ordered_offset(take, &row_taken);
    if (take) {
      acc_top[written + before] = acc(j);
      index_top[written + before] = index(j);
    }
    seen_at_v += row_at_v;
    written += row_taken;
  }
  return k;
}

__global__ void top_segments_kernel(const TopSegment* tops, int64_t n) {
  __shared__ SelectState state;
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {  // (the same s for the whole block)
    const TopSegment& t = tops[s];
    top_of(
        t.count, t.k, [&](int64_t j) { return t.acc[j]; }, [&](int64_t j) { return t.index[j]; }, t.acc_top,
        t.index_top, &state);
  }
}

// f called with an accessor of t's every element's acc (float).
template <typename F>
__device__ void with_every(const FixedTop& t, F f) {
  on_type(t.every_type, [&](auto tag) {
    const auto* every = static_cast<const Storage<decltype(tag)>*>(t.every);
    f([=](int64_t i) { return to_float(every[i]); });
  });
}

__global__ void fixed_tops_kernel(const FixedTop* tops, int64_t n, const int64_t* totals, int64_t* counts) {
  __shared__ SelectState state;
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {  // (the same s for the whole block)
    const FixedTop& t = tops[s];
    const int64_t count = totals[s];
    const auto position = [](int64_t i) { return int32_t(i); };
    int64_t selected;
    if (count > t.too_many && count <= t.room) {  // above its band: the candidates' top k
      selected = top_of(
          count, t.k, [&](int64_t j) { return t.acc[j]; }, [&](int64_t j) { return t.index[j]; }, t.acc_top,
          t.index_top, &state);
    } else if (count > t.too_many || count < t.too_few) {  // more than its room, or below: every element's
      with_every(t, [&](auto acc) { selected = top_of(t.numel, t.k, acc, position, t.acc_top, t.index_top, &state); });
    } else {  // inside its band: the candidates as they are
      selected = top_of(
          count, count, [&](int64_t j) { return t.acc[j]; }, [&](int64_t j) { return t.index[j]; }, t.acc_top,
          t.index_top, &state);
    }
    if (threadIdx.x == 0) counts[s] = selected;
  }
}

__global__ void send_segments_kernel(const SendSegment* sends, int64_t n, int64_t total) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < total; j += int64_t(gridDim.x) * blockDim.x) {
    const SendSegment& d = sends[segment_of(sends, n, j, [](const SendSegment& g) { return g.at; })];
    const int64_t e = j - d.at;
    if (d.limit && e >= *d.limit) continue;  // (past a fixed capacity's count)
    on_type(d.value_type, [&](auto tag) {
      using T = Storage<decltype(tag)>;
      static_cast<T*>(d.values)[e] = send<T>(d.fb, d.index[e], d.acc[e]);
    });
  }
}

// Tile t of every gradient's square tiles (sum_of_squares's tile_squares_kernel, segmented).
__global__ void square_segments_kernel(const ClipSegment* grads, int64_t n, int64_t tiles, double* tile_sums) {
  __shared__ double scratch[kSquareLanes];
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {  // (the same t for the whole block)
    const ClipSegment& g = grads[segment_of(grads, n, t, [](const ClipSegment& s) { return s.tile_at; })];
    const int64_t first = (t - g.tile_at) * kSquareTile;
    const int64_t end = first + kSquareTile < g.numel ? first + kSquareTile : g.numel;
    double lane = 0.0;
    on_type(g.grad_type, [&](auto tag) {
      const auto* x = static_cast<const Storage<decltype(tag)>*>(g.grad);
      for (int64_t i = first + threadIdx.x; i < end; i += kSquareLanes) lane += square(to_float(x[i]));
    });
    const double total = block_sum(lane, scratch);
    if (threadIdx.x == 0) tile_sums[t] = total;
  }
}

// A block a gradient: its tiles' sums added as sum_tiles_kernel adds them, then its factor.
__global__ void clip_factors_kernel(const ClipSegment* grads, int64_t n, const double* tile_sums) {
  __shared__ double scratch[kSquareLanes];
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {  // (the same s for the whole block)
    const ClipSegment& g = grads[s];
    double lane = 0.0;
    for (int64_t t = threadIdx.x; t < square_tiles(g.numel); t += kSquareLanes) lane += tile_sums[g.tile_at + t];
    const double norm = sqrt(block_sum(lane, scratch));
    if (threadIdx.x == 0) *g.factor = norm > g.limit ? float((1.0 / norm) * g.limit) : 1.0f;  // (torch's limit / norm)
  }
}

__global__ void momentum_segments_kernel(const MomentumSegment* grads, int64_t n, int64_t total) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < total; j += int64_t(gridDim.x) * blockDim.x) {
    const MomentumSegment& g = grads[segment_of(grads, n, j, [](const MomentumSegment& m) { return m.at; })];
    on_type(g.grad_type, [&](auto tag) {
      auto* grad = static_cast<Storage<decltype(tag)>*>(g.grad);
      momentum_element(grad, g.fb, j - g.at, grad);
    });
  }
}

}  // namespace

void sample_segments(const Segment* segments, int64_t n, int64_t samples, int64_t blocks, float* sample,
                     SelectState* states, float* thresholds, cudaStream_t stream) {
  if (n == 0) return;
  if (samples > 0) {
    gather_samples_kernel<<<grid_for(samples), kThreads, 0, stream>>>(segments, n, samples, sample);
    check_launch("gather_samples_kernel");
  }
  start_segments_kernel<<<grid_for(n, 1), 256, 0, stream>>>(segments, n, states, thresholds);
  check_launch("start_segments_kernel");
  if (samples == 0) return;
  for (int shift = 24; shift >= 0; shift -= 8) {
    digit_segments_kernel<<<grid_for(blocks, 1), 256, 0, stream>>>(segments, n, blocks, sample, shift, states);
    check_launch("digit_segments_kernel");
    choose_segments_kernel<<<grid_for(n), kThreads, 0, stream>>>(segments, n, shift, states, thresholds);
    check_launch("choose_segments_kernel");
  }
}

void count_segments(const Segment* segments, int64_t n, int64_t tiles, const float* thresholds, int32_t* tile_counts,
                    cudaStream_t stream) {
  if (tiles == 0) return;
  count_segments_kernel<<<grid_for(tiles, 1), kThreads, 0, stream>>>(segments, n, tiles, thresholds, tile_counts);
  check_launch("count_segments_kernel");
}

void segment_totals(const Segment* segments, int64_t n, const int64_t* inclusive, int64_t* totals,
                    cudaStream_t stream) {
  if (n == 0) return;
  segment_totals_kernel<<<grid_for(n), kThreads, 0, stream>>>(segments, n, inclusive, totals);
  check_launch("segment_totals_kernel");
}

void compact_segments(const Segment* segments, int64_t n, int64_t tiles, const float* thresholds,
                      const int32_t* tile_counts, const int64_t* inclusive, const int64_t* totals, float* acc,
                      int32_t* index, cudaStream_t stream) {
  if (tiles == 0) return;
  compact_segments_kernel<<<grid_for(tiles, 1), kThreads, 0, stream>>>(segments, n, tiles, thresholds, tile_counts,
                                                                       inclusive, totals, acc, index);
  check_launch("compact_segments_kernel");
}

void top_segments(const TopSegment* tops, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  top_segments_kernel<<<grid_for(n, 1), kThreads, 0, stream>>>(tops, n);
  check_launch("top_segments_kernel");
}

void fixed_tops(const FixedTop* tops, int64_t n, const int64_t* totals, int64_t* counts, cudaStream_t stream) {
  if (n == 0) return;
  fixed_tops_kernel<<<grid_for(n, 1), kThreads, 0, stream>>>(tops, n, totals, counts);
  check_launch("fixed_tops_kernel");
}

void send_segments(const SendSegment* sends, int64_t n, int64_t total, cudaStream_t stream) {
  if (total == 0) return;
  send_segments_kernel<<<grid_for(total), kThreads, 0, stream>>>(sends, n, total);
  check_launch("send_segments_kernel");
}

void clip_segments(const ClipSegment* grads, int64_t n, int64_t tiles, double* tile_sums, cudaStream_t stream) {
  if (n == 0) return;
  if (tiles > 0) {
    square_segments_kernel<<<grid_for(tiles, 1), kSquareLanes, 0, stream>>>(grads, n, tiles, tile_sums);
    check_launch("square_segments_kernel");
  }
  clip_factors_kernel<<<grid_for(n, 1), kSquareLanes, 0, stream>>>(grads, n, tile_sums);
  check_launch("clip_factors_kernel");
}

void momentum_segments(const MomentumSegment* grads, int64_t n, int64_t total, cudaStream_t stream) {
  if (total == 0) return;
  momentum_segments_kernel<<<grid_for(total), kThreads, 0, stream>>>(grads, n, total);
  check_launch("momentum_segments_kernel");
}

}  // namespace cuda
}  // namespace sparsecomm
