// CUDA launchers: raw device pointers, sizes and the caller's stream; no framework types,
// no host synchronisation. Instantiated for T = float, half16, bfloat16.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>
#include "../kernels/common.h"

namespace sparsecomm {
namespace cuda {

template <typename T>
void block_pack(const T* grad, const float* residual_in, float* residual_out, T* values,
                int64_t numel, int64_t start, int64_t length, cudaStream_t stream);

template <typename T>
void block_unpack(const T* values, T* dense, int64_t numel, int64_t start, int64_t length, float scale,
                  cudaStream_t stream);

}  // namespace cuda
}  // namespace sparsecomm
