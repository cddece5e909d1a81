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

inline void check_residual(const char* op, const at::Tensor& grad, const c10::optional<at::Tensor>& residual) {
  if (!residual.has_value()) return;
  const at::Tensor& r = *residual;
  TORCH_CHECK(r.scalar_type() == at::kFloat, op, ": residual should be float32, got ", r.scalar_type());
  TORCH_CHECK(r.is_contiguous(), op, ": residual should be contiguous");
  TORCH_CHECK(r.numel() == grad.numel(), op, ": residual should have numel ", grad.numel(), " like grad, got ",
              r.numel());
  TORCH_CHECK(r.device() == grad.device(), op, ": residual should be on ", grad.device(), " like grad, got ",
              r.device());
}

}  // namespace torch_binding
}  // namespace sparsecomm
