// CUDA launchers for csrc/kernels/block.h: one grid-stride pass over the tensor.
#include "../kernels/block.h"
#include "grid.cuh"
#include "launchers.h"

namespace sparsecomm {
namespace cuda {
namespace {

template <typename T>
__global__ void block_pack_kernel(const T* grad, Feedback fb, T* values, int64_t numel, int64_t start, int64_t length) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = block_position(i, start, numel);
    block_pack_element(i, j, j < length, grad, fb, values);
  }
}

template <typename T>
__global__ void block_unpack_kernel(const T* values, T* dense, int64_t numel, int64_t start, int64_t length,
                                    float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = block_position(i, start, numel);
    dense[i] = block_unpack_element(j, j < length, values, scale);
  }
}

}  // namespace

template <typename T>
void block_pack(const T* grad, const float* residual_in, float* residual_out, T* values, int64_t numel, int64_t start,
                int64_t length, cudaStream_t stream) {
  if (numel == 0) return;
  Feedback fb;
  fb.residual_in = residual_in;
  fb.residual_out = residual_out;
  block_pack_kernel<T><<<grid_for(numel), kThreads, 0, stream>>>(grad, fb, values, numel, start, length);
  check_launch("block_pack_kernel");
}

template <typename T>
void block_unpack(const T* values, T* dense, int64_t numel, int64_t start, int64_t length, float scale,
                  cudaStream_t stream) {
  if (numel == 0) return;
  block_unpack_kernel<T><<<grid_for(numel), kThreads, 0, stream>>>(values, dense, numel, start, length, scale);
  check_launch("block_unpack_kernel");
}

#define SC_INSTANTIATE(T)                                                                                   \
  template void block_pack<T>(const T*, const float*, float*, T*, int64_t, int64_t, int64_t, cudaStream_t); \
  template void block_unpack<T>(const T*, T*, int64_t, int64_t, int64_t, float, cudaStream_t);
SC_FOR_FLOAT_TYPES(SC_INSTANTIATE)
#undef SC_INSTANTIATE

}  // namespace cuda
}  // namespace sparsecomm
