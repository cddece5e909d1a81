// CUDA launchers for selection with error feedback (feedback.h, sample.h, permutation.h, squares.h,
// quantize.h). Everything runs on the caller's stream; nothing here synchronises with the host.
#include "grid.cuh"
#include "launchers.h"
#include "tiles.cuh"

namespace sparsecomm {
namespace cuda {
namespace {

template <typename T>
__global__ void gather_sample_kernel(const T* grad, Feedback fb, SamplePlan plan, float* sample) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < plan.count;
       j += int64_t(gridDim.x) * blockDim.x) {
    float u;
    sample[j] = magnitude(accumulated(grad, fb, plan.position(j), &u));
  }
}

SelectState* select_state(float* sample, int64_t count) {  // the first aligned address after the sample
  const uintptr_t end = reinterpret_cast<uintptr_t>(sample + count), align = alignof(SelectState);
  return reinterpret_cast<SelectState*>((end + align - 1) / align * align);
}

__global__ void select_start_kernel(SelectState* state, int64_t rank) { start_select(state, rank); }

__global__ void digit_histogram_kernel(const float* values, int64_t n, int shift, SelectState* state) {
  add_digits(blockIdx.x * int64_t(blockDim.x), n, int64_t(gridDim.x) * blockDim.x, shift, state,
             [&](int64_t j) { return values[j]; });
}

__global__ void choose_digit_kernel(int shift, SelectState* state, float* out) { choose_digit(shift, state, out); }

__global__ void fill_kernel(float* out, float value) { *out = value; }

template <typename T>
__global__ void accumulate_count_kernel(const T* grad, Feedback fb, int64_t numel, const float* threshold,
                                        int32_t* tile_counts) {
  const int count = count_tile(blockIdx.x * kCandidateTile, numel, *threshold, [&](int64_t i) {
    float u;
    const float acc = accumulated(grad, fb, i, &u);
    keep(fb, i, acc, u);
    return acc;
  });
  if (threadIdx.x == 0) tile_counts[blockIdx.x] = count;
}

template <typename S>
__global__ void compact_candidates_kernel(const S* source, int64_t numel, const float* threshold,
                                          const int64_t* tile_offsets, float* acc_out, int32_t* index_out) {
  compact_tile(
      blockIdx.x * kCandidateTile, numel, *threshold, tile_offsets[blockIdx.x],
      [&](int64_t i) { return to_float(source[i]); }, acc_out, index_out);
}

template <typename T>
__global__ void send_selected_kernel(const float* acc, const int32_t* index, int64_t count, Feedback fb, T* values) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < count; j += int64_t(gridDim.x) * blockDim.x)
    values[j] = send<T>(fb, index[j], acc[j]);
}

template <typename T>
__global__ void accumulate_kernel(const T* grad, Feedback fb, int64_t numel) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x)
    accumulate_element(grad, fb, i);
}

template <typename T>
__global__ void momentum_step_kernel(const T* grad, Feedback fb, int64_t numel, T* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x)
    momentum_element(grad, fb, i, out);
}

// squares.h's order: thread j is lane j (blocks of kSquareLanes threads), block_sum adds the
// lanes pairwise. Each tile's sum goes to tile_sums[t], whichever block took it.
template <typename T>
__global__ void tile_squares_kernel(const T* x, int64_t numel, double* tile_sums) {
  __shared__ double scratch[kSquareLanes];
  for (int64_t t = blockIdx.x; t < square_tiles(numel); t += gridDim.x) {  // (the same t for the whole block)
    const int64_t end = (t + 1) * kSquareTile < numel ? (t + 1) * kSquareTile : numel;
    double lane = 0.0;
    for (int64_t i = t * kSquareTile + threadIdx.x; i < end; i += kSquareLanes) lane += square(to_float(x[i]));
    const double total = block_sum(lane, scratch);
    if (threadIdx.x == 0) tile_sums[t] = total;
  }
}

__global__ void sum_tiles_kernel(const double* tile_sums, int64_t tiles, double* out) {
  __shared__ double scratch[kSquareLanes];
  double lane = 0.0;
  for (int64_t t = threadIdx.x; t < tiles; t += kSquareLanes) lane += tile_sums[t];
  const double total = block_sum(lane, scratch);
  if (threadIdx.x == 0) *out = total;
}

// One block (tiles.cuh's quantize_block): the scales are the same on every run.
__global__ void send_quantized_kernel(const float* acc, const int32_t* index, int64_t count, Feedback fb, int bits,
                                      uint8_t* codes, float* scales) {
  __shared__ double scratch[kQuantThreads];
  __shared__ float scale[4];
  quantize_block(acc, index, count, fb, bits, codes, scales, scratch, scale);
}

__global__ void dequantize_kernel(const uint8_t* codes, const float* scales, int64_t count, int bits, float* values) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < count; j += int64_t(gridDim.x) * blockDim.x)
    values[j] = scales[read_code(codes, j, bits)];
}

template <typename T>
__global__ void sparse_unpack_sorted_kernel(const T* values, const int32_t* sorted_index, const int64_t* order,
                                            int64_t count, UnpackScale scale, T* dense) {
  const float factor = scale.value();
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < count; p += int64_t(gridDim.x) * blockDim.x) {
    if (p > 0 && sorted_index[p - 1] == sorted_index[p]) continue;  // not the head of its run
    float sum = 0.0f;
    for (int64_t q = p; q < count && sorted_index[q] == sorted_index[p]; ++q) sum += to_float(values[order[q]]);
    dense[sorted_index[p]] = from_float<T>(factor * sum);
  }
}

__global__ void random_k_kernel(Permutation perm, int64_t k, int32_t* out) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < k; j += int64_t(gridDim.x) * blockDim.x)
    out[j] = int32_t(perm(j));
}

}  // namespace

template <typename T>
void sample_threshold(const T* grad, const Feedback& fb, int64_t numel, const SamplePlan& plan, float* sample,
                      float* threshold, cudaStream_t stream) {
  if (numel == 0 || plan.count == 0) {
    fill_kernel<<<1, 1, 0, stream>>>(threshold, bits_float(0x7f800000u));
    check_launch("fill_kernel");
    return;
  }
  gather_sample_kernel<T><<<grid_for(plan.count), kThreads, 0, stream>>>(grad, fb, plan, sample);
  check_launch("gather_sample_kernel");
  SelectState* state = select_state(sample, plan.count);
  select_start_kernel<<<1, 256, 0, stream>>>(state, plan.rank);
  check_launch("select_start_kernel");
  for (int shift = 24; shift >= 0; shift -= 8) {
    digit_histogram_kernel<<<grid_for(plan.count, kThreads * kSelectItems), 256, 0, stream>>>(sample, plan.count, shift,
                                                                                              state);
    check_launch("digit_histogram_kernel");
    choose_digit_kernel<<<1, 1, 0, stream>>>(shift, state, threshold);
    check_launch("choose_digit_kernel");
  }
}

template <typename T>
void accumulate_count(const T* grad, const Feedback& fb, int64_t numel, const float* threshold, int32_t* tile_counts,
                      cudaStream_t stream) {
  if (numel == 0) return;
  accumulate_count_kernel<T>
      <<<int(candidate_tiles(numel)), kThreads, 0, stream>>>(grad, fb, numel, threshold, tile_counts);
  check_launch("accumulate_count_kernel");
}

template <typename S>
void compact_candidates(const S* source, int64_t numel, const float* threshold, const int64_t* tile_offsets, float* acc,
                        int32_t* index, cudaStream_t stream) {
  if (numel == 0) return;
  compact_candidates_kernel<S>
      <<<int(candidate_tiles(numel)), kThreads, 0, stream>>>(source, numel, threshold, tile_offsets, acc, index);
  check_launch("compact_candidates_kernel");
}

template <typename T>
void send_selected(const float* acc, const int32_t* index, int64_t count, const Feedback& fb, T* values,
                   cudaStream_t stream) {
  if (count == 0) return;
  send_selected_kernel<T><<<grid_for(count), kThreads, 0, stream>>>(acc, index, count, fb, values);
  check_launch("send_selected_kernel");
}

template <typename T>
void accumulate(const T* grad, const Feedback& fb, int64_t numel, cudaStream_t stream) {
  if (numel == 0) return;
  accumulate_kernel<T><<<grid_for(numel), kThreads, 0, stream>>>(grad, fb, numel);
  check_launch("accumulate_kernel");
}

template <typename T>
void momentum_step(const T* grad, const Feedback& fb, int64_t numel, T* out, cudaStream_t stream) {
  if (numel == 0) return;
  momentum_step_kernel<T><<<grid_for(numel), kThreads, 0, stream>>>(grad, fb, numel, out);
  check_launch("momentum_step_kernel");
}

template <typename T>
void sum_of_squares(const T* x, int64_t numel, double* tile_sums, double* out, cudaStream_t stream) {
  const int64_t tiles = square_tiles(numel);
  if (tiles > 0) {
    tile_squares_kernel<T><<<grid_for(tiles, 1), kSquareLanes, 0, stream>>>(x, numel, tile_sums);
    check_launch("tile_squares_kernel");
  }
  // (an empty tensor: 0)
  sum_tiles_kernel<<<1, kSquareLanes, 0, stream>>>(tile_sums, tiles, out);
  check_launch("sum_tiles_kernel");
}

void send_quantized(const float* acc, const int32_t* index, int64_t count, const Feedback& fb, int bits, uint8_t* codes,
                    float* scales, cudaStream_t stream) {
  send_quantized_kernel<<<1, kQuantThreads, 0, stream>>>(acc, index, count, fb, bits, codes, scales);
  check_launch("send_quantized_kernel");
}

void dequantize(const uint8_t* codes, const float* scales, int64_t count, int bits, float* values,
                cudaStream_t stream) {
  if (count == 0) return;
  dequantize_kernel<<<grid_for(count), kThreads, 0, stream>>>(codes, scales, count, bits, values);
  check_launch("dequantize_kernel");
}

template <typename T>
void sparse_unpack_sorted(const T* values, const int32_t* sorted_index, const int64_t* order, int64_t count,
                          UnpackScale scale, T* dense, cudaStream_t stream) {
  if (count == 0) return;
  sparse_unpack_sorted_kernel<T>
      <<<grid_for(count), kThreads, 0, stream>>>(values, sorted_index, order, count, scale, dense);
  check_launch("sparse_unpack_sorted_kernel");
}

void random_k_indices(const Permutation& perm, int64_t k, int32_t* out, cudaStream_t stream) {
  if (k == 0) return;
  random_k_kernel<<<grid_for(k), kThreads, 0, stream>>>(perm, k, out);
  check_launch("random_k_kernel");
}

#define SC_INSTANTIATE(T)                                                                                      \
  template void sample_threshold<T>(const T*, const Feedback&, int64_t, const SamplePlan&, float*, float*,     \
                                    cudaStream_t);                                                             \
  template void accumulate_count<T>(const T*, const Feedback&, int64_t, const float*, int32_t*, cudaStream_t); \
  template void compact_candidates<T>(const T*, int64_t, const float*, const int64_t*, float*, int32_t*,       \
                                      cudaStream_t);                                                           \
  template void send_selected<T>(const float*, const int32_t*, int64_t, const Feedback&, T*, cudaStream_t);    \
  template void accumulate<T>(const T*, const Feedback&, int64_t, cudaStream_t);                               \
  template void momentum_step<T>(const T*, const Feedback&, int64_t, T*, cudaStream_t);                        \
  template void sum_of_squares<T>(const T*, int64_t, double*, double*, cudaStream_t);                          \
  template void sparse_unpack_sorted<T>(const T*, const int32_t*, const int64_t*, int64_t, UnpackScale, T*,    \
                                        cudaStream_t);
SC_FOR_FLOAT_TYPES(SC_INSTANTIATE)
#undef SC_INSTANTIATE

}  // namespace cuda
}  // namespace sparsecomm
