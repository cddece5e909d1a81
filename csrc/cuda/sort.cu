// The sorts and the scan that csrc/torch/cuda.cpp takes from torch (cumsum, sort), as cub
// calls, for the TF binding: TF has no sort or scan a g++-compiled kernel can call (its cub
// helpers are headers for nvcc-compiled TF sources). Everything runs on the caller's stream;
// nothing here synchronises with the host.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "grid.cuh"
#include "launchers.h"

namespace sparsecomm {
namespace cuda {
namespace {

// Buffers taken one after another from the caller's scratch. Without scratch (a size query)
// only the bytes are counted, so the query and the run agree on the layout by construction.
class Carve {
 public:
  explicit Carve(void* scratch) : base_(static_cast<char*>(scratch)) {}
  bool query() const { return base_ == nullptr; }
  // At least 1 byte, so that the caller's allocation is never empty (and never null).
  size_t bytes() const { return std::max<size_t>(used_, 1); }
  template <typename T>
  T* take(int64_t n) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += (size_t(n) * sizeof(T) + 255) / 256 * 256;  // cudaMalloc's alignment
    return p;
  }

 private:
  char* base_;
  size_t used_ = 0;
};

template <typename I>
__global__ void iota_kernel(I* out, int64_t n) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < n; j += int64_t(gridDim.x) * blockDim.x)
    out[j] = I(j);
}

__global__ void magnitude_kernel(const float* acc, int64_t count, float* key) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < count; j += int64_t(gridDim.x) * blockDim.x)
    key[j] = magnitude(acc[j]);
}

__global__ void gather_kernel(const float* acc, const int32_t* index, const int32_t* position, int64_t k,
                              float* acc_out, int32_t* index_out) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < k; j += int64_t(gridDim.x) * blockDim.x) {
    acc_out[j] = acc[position[j]];
    index_out[j] = index[position[j]];
  }
}

}  // namespace

size_t candidate_offsets(const int32_t* tile_counts, int64_t tiles, int64_t* tile_offsets, void* scratch,
                         cudaStream_t stream) {
  Carve carve(scratch);
  size_t cub_bytes = 0;  // summed as int32: the total is at most numel < 2^31 (int32 indices)
  cub::DeviceScan::ExclusiveSum(nullptr, cub_bytes, tile_counts, tile_offsets, tiles + 1, stream);
  void* cub_scratch = carve.take<char>(int64_t(cub_bytes));
  if (!carve.query())
    cub::DeviceScan::ExclusiveSum(cub_scratch, cub_bytes, tile_counts, tile_offsets, tiles + 1, stream);
  return carve.bytes();
}

size_t sort_index(const int32_t* index, int64_t count, int32_t* sorted_index, int64_t* order, void* scratch,
                  cudaStream_t stream) {
  Carve carve(scratch);
  int64_t* position = carve.take<int64_t>(count);
  size_t cub_bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, index, sorted_index, position, order, count, 0, 32, stream);
  void* cub_scratch = carve.take<char>(int64_t(cub_bytes));
  if (carve.query() || count == 0) return carve.bytes();
  iota_kernel<<<grid_for(count), kThreads, 0, stream>>>(position, count);
  check_launch("iota_kernel");
  cub::DeviceRadixSort::SortPairs(cub_scratch, cub_bytes, index, sorted_index, position, order, count, 0, 32,
                                  stream);  // radix sorts are stable: equal indices keep input order
  return carve.bytes();
}

size_t sort_ascending(const int32_t* in, int64_t n, int32_t* out, void* scratch, cudaStream_t stream) {
  Carve carve(scratch);
  size_t cub_bytes = 0;
  cub::DeviceRadixSort::SortKeys(nullptr, cub_bytes, in, out, n, 0, 32, stream);
  void* cub_scratch = carve.take<char>(int64_t(cub_bytes));
  if (!carve.query() && n > 0) cub::DeviceRadixSort::SortKeys(cub_scratch, cub_bytes, in, out, n, 0, 32, stream);
  return carve.bytes();
}

size_t select_top(const float* acc, const int32_t* index, int64_t count, int64_t k, float* acc_top, int32_t* index_top,
                  void* scratch, cudaStream_t stream) {
  k = std::clamp<int64_t>(k, 0, count);
  Carve carve(scratch);
  float* key = carve.take<float>(count);
  float* sorted_key = carve.take<float>(count);  // unused, but cub writes it
  int32_t* position = carve.take<int32_t>(count);
  int32_t* by_magnitude = carve.take<int32_t>(count);
  int32_t* kept = carve.take<int32_t>(k);
  size_t cub_bytes = 0;
  cub::DeviceRadixSort::SortPairsDescending(nullptr, cub_bytes, key, sorted_key, position, by_magnitude, count, 0, 32,
                                            stream);
  const size_t pair_bytes = cub_bytes;
  const size_t sort_bytes = sort_ascending(nullptr, k, nullptr, nullptr, stream);
  void* cub_scratch = carve.take<char>(int64_t(std::max(pair_bytes, sort_bytes)));
  if (carve.query() || k == 0) return carve.bytes();
  if (k == count) {  // everything is kept, as it is
    cudaMemcpyAsync(acc_top, acc, count * sizeof(float), cudaMemcpyDeviceToDevice, stream);
    cudaMemcpyAsync(index_top, index, count * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream);
    return carve.bytes();
  }
  magnitude_kernel<<<grid_for(count), kThreads, 0, stream>>>(acc, count, key);
  check_launch("magnitude_kernel");
  iota_kernel<<<grid_for(count), kThreads, 0, stream>>>(position, count);
  check_launch("iota_kernel");
  // Stable: equal magnitudes keep the lower position first, as cpu::select_top.
  cub_bytes = pair_bytes;
  cub::DeviceRadixSort::SortPairsDescending(cub_scratch, cub_bytes, key, sorted_key, position, by_magnitude, count, 0,
                                            32, stream);
  sort_ascending(by_magnitude, k, kept, cub_scratch, stream);  // the first k, back to input order
  gather_kernel<<<grid_for(k), kThreads, 0, stream>>>(acc, index, kept, k, acc_top, index_top);
  check_launch("gather_kernel");
  return carve.bytes();
}

}  // namespace cuda
}  // namespace sparsecomm
