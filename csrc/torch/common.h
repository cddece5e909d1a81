// Shared by the CPU and CUDA torch bindings: argument checks with messages that say what was
// expected and what came, and the dtype dispatch onto the framework-free storage types.
#pragma once
#include <torch/library.h>
#include <ATen/ATen.h>
#include "../kernels/common.h"

namespace sparsecomm {
namespace torch_binding {

// Runs body with scalar_t bound to the framework-free type of `dtype`.
#define SC_DISPATCH_FLOAT_TYPES(dtype, op_name, ...)                                              \
  [&] {                                                                                           \
    switch (dtype) {                                                                              \
      case at::kFloat: { using scalar_t = float; return __VA_ARGS__(); }                          \
      case at::kHalf: { using scalar_t = ::sparsecomm::half16; return __VA_ARGS__(); }            \
      case at::kBFloat16: { using scalar_t = ::sparsecomm::bfloat16; return __VA_ARGS__(); }      \
      default:                                                                                    \
        TORCH_CHECK(false, op_name, ": expected a float32, float16 or bfloat16 tensor, got ", dtype); \
    }                                                                                             \
  }()

template <typename T>
T* data_as(const at::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); }

inline void check_block(const char* op, int64_t numel, int64_t start, int64_t length) {
  TORCH_CHECK(length >= 0 && length <= numel, op, ": length should be in [0, numel=", numel, "], got ", length);
  TORCH_CHECK(numel == 0 ? start == 0 : (start >= 0 && start < numel), op,
              ": start should be in [0, numel=", numel, "), got ", start);
}

// A float32 state tensor (residual or momentum) matching `like` in numel and device.
inline float* state_ptr(const char* op, const char* name, const at::Tensor& like,
                        const c10::optional<at::Tensor>& state) {
  if (!state.has_value()) return nullptr;
  const at::Tensor& s = *state;
  TORCH_CHECK(s.scalar_type() == at::kFloat, op, ": ", name, " should be float32, got ", s.scalar_type());
  TORCH_CHECK(s.is_contiguous(), op, ": ", name, " should be contiguous");
  TORCH_CHECK(s.numel() == like.numel(), op, ": ", name, " should have numel ", like.numel(), " like grad, got ",
              s.numel());
  TORCH_CHECK(s.device() == like.device(), op, ": ", name, " should be on ", like.device(), " like grad, got ",
              s.device());
  return s.data_ptr<float>();
}

// Indices are int32 on the wire: tensors of 2^31 elements or more are not supported.
inline void check_indexable(const char* op, int64_t numel) {
  TORCH_CHECK(numel < (int64_t(1) << 31), op, ": tensors of at most 2^31 - 1 elements are supported (int32 "
              "indices), got ", numel);
}

inline void check_candidates(const char* op, const at::Tensor& acc, const at::Tensor& index) {
  TORCH_CHECK(acc.scalar_type() == at::kFloat && acc.dim() == 1, op, ": acc should be a 1-D float32 tensor, got ",
              acc.dim(), "-D ", acc.scalar_type());
  TORCH_CHECK(index.scalar_type() == at::kInt && index.dim() == 1, op,
              ": index should be a 1-D int32 tensor, got ", index.dim(), "-D ", index.scalar_type());
  TORCH_CHECK(acc.numel() == index.numel(), op, ": acc and index should have the same length, got ", acc.numel(),
              " and ", index.numel());
}

}  // namespace torch_binding
}  // namespace sparsecomm
