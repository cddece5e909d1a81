// CPU launchers: raw pointers and sizes, no framework types. Instantiated for
// T = float, half16, bfloat16. Called by csrc/torch and csrc/tensorflow.
#pragma once
#include <cstdint>
#include "../kernels/common.h"

namespace sparsecomm {
namespace cpu {

template <typename T>
void block_pack(const T* grad, const float* residual_in, float* residual_out, T* values,
                int64_t numel, int64_t start, int64_t length);

template <typename T>
void block_unpack(const T* values, T* dense, int64_t numel, int64_t start, int64_t length, float scale);

}  // namespace cpu
}  // namespace sparsecomm
