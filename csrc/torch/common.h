// Shared by the torch op families (block.h, select.h, quantize.h): argument checks with
// messages that say what was expected and what came, and the dtype dispatch onto the
// framework-free storage types.
//
// Each op body is written once over a device policy `Device` (CpuDevice in cpu.cpp,
// CudaDevice in cuda.cpp), which provides:
//   Guard                               constructed from an at::Device (CUDA: selects it)
//   check_index_range(op, index, numel) (a no-op on CUDA: it would need a host synchronisation)
//   the launchers with csrc/cpu/launchers.h's signatures (CUDA: on torch's current stream), SC_TYPED_LAUNCHERS
//   and SC_UNTYPED_LAUNCHERS:
//     block_pack<T>, block_unpack<T>, send_selected<T>, accumulate<T>, momentum_step<T>, sum_of_squares<T>,
//     send_quantized, dequantize
//   the steps that differ by device, over tensors (each says why where it is defined):
//     sample_threshold<T>, accumulate_candidates<T>, select_top, sparse_unpack<T>, random_k_indices,
//     wire_rows(values, index, start, length, rows), wire_rows_many(sends, device),
//     wire_columns(rows, value_dtype, exact), unpack_gathered_rows(gathered, regions, width, value_dtype, scale, outs)
//   a bucket's sampled packs in phases (select.h's pack_sampled_many; CPU: select.h's TensorByTensor,
//     CUDA: cuda_bucket.h's fixed number of launches): Bucket, count_bucket(tensors), bucket_totals(bucket),
//     bucket_candidates(bucket, tensors, totals), select_top_many(lists), send_bucket(tensors, accs, indices, masking)
//     and its dense momentum steps and clipping factors: momentum_many(grads), clip_factors(clips)
//   raw bytes for quantize.h's segments: copy_bytes(from, to), zero_bytes(t), write_count(segment,
//     count), read_count(gathered, at) (CUDA: a read back), segment_offsets(index, counts, offsets),
//     segment_index(counts, offsets, index); at fixed capacity (DDP's), pack_fixed(tensors, masking, bits),
//     write_fixed_segments(sends, items, device), unpack_gathered_segments(gathered, regions, bits, scale, outs)
#pragma once
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>

#include "../kernels/feedback.h"
#include "../kernels/permutation.h"
#include "../kernels/quantize.h"
#include "../kernels/sample.h"
#include "../kernels/squares.h"
#include "../kernels/wire.h"

namespace sparsecomm {
namespace torch_binding {

// Runs body with scalar_t bound to the framework-free type of `dtype`.
#define SC_DISPATCH_FLOAT_TYPES(dtype, op_name, ...)                                                  \
  [&] {                                                                                               \
    switch (dtype) {                                                                                  \
      case at::kFloat: {                                                                              \
        using scalar_t = float;                                                                       \
        return __VA_ARGS__();                                                                         \
      }                                                                                               \
      case at::kHalf: {                                                                               \
        using scalar_t = ::sparsecomm::half16;                                                        \
        return __VA_ARGS__();                                                                         \
      }                                                                                               \
      case at::kBFloat16: {                                                                           \
        using scalar_t = ::sparsecomm::bfloat16;                                                      \
        return __VA_ARGS__();                                                                         \
      }                                                                                               \
      default:                                                                                        \
        TORCH_CHECK(false, op_name, ": expected a float32, float16 or bfloat16 tensor, got ", dtype); \
    }                                                                                                 \
  }()

// The launchers a device policy forwards as they are (cpu.cpp, cuda.cpp): X(name) for each, those
// over a float storage type T (called as name<T>), then the others.
#define SC_TYPED_LAUNCHERS(X) \
  X(block_pack)               \
  X(block_unpack)             \
  X(send_selected)            \
  X(accumulate)               \
  X(momentum_step)            \
  X(sum_of_squares)
#define SC_UNTYPED_LAUNCHERS(X) \
  X(send_quantized)             \
  X(dequantize)

template <typename T>
T* data_as(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

inline void check_block(const char* op, int64_t numel, int64_t start, int64_t length) {
  TORCH_CHECK(length >= 0 && length <= numel, op, ": length should be in [0, numel=", numel, "], got ", length);
  TORCH_CHECK(numel == 0 ? start == 0 : (start >= 0 && start < numel), op, ": start should be in [0, numel=", numel,
              "), got ", start);
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
  TORCH_CHECK(numel < (int64_t(1) << 31), op,
              ": tensors of at most 2^31 - 1 elements are supported (int32 "
              "indices), got ",
              numel);
}

inline void check_candidates(const char* op, const at::Tensor& acc, const at::Tensor& index) {
  TORCH_CHECK(acc.scalar_type() == at::kFloat && acc.dim() == 1, op, ": acc should be a 1-D float32 tensor, got ",
              acc.dim(), "-D ", acc.scalar_type());
  TORCH_CHECK(index.scalar_type() == at::kInt && index.dim() == 1, op, ": index should be a 1-D int32 tensor, got ",
              index.dim(), "-D ", index.scalar_type());
  TORCH_CHECK(acc.numel() == index.numel(), op, ": acc and index should have the same length, got ", acc.numel(),
              " and ", index.numel());
}

// The error-feedback state of an op call: grad made contiguous, residual/momentum and the
// gradient's scale checked.
struct FeedbackArgs {
  at::Tensor grad;
  Feedback fb;
  FeedbackArgs(const char* op, const at::Tensor& grad_in, const c10::optional<at::Tensor>& residual,
               const c10::optional<at::Tensor>& momentum, double momentum_factor,
               const c10::optional<at::Tensor>& grad_scale, bool nesterov = false)
      : grad(grad_in.contiguous()) {
    check_indexable(op, grad.numel());
    fb.residual_in = fb.residual_out = state_ptr(op, "residual", grad, residual);
    fb.momentum_in = fb.momentum_out = state_ptr(op, "momentum", grad, momentum);
    fb.momentum = float(momentum_factor);
    TORCH_CHECK(!nesterov || momentum.has_value(), op, ": nesterov=True needs a momentum tensor, got None");
    fb.nesterov = nesterov;
    if (grad_scale.has_value()) {
      const at::Tensor& s = *grad_scale;
      TORCH_CHECK(s.scalar_type() == at::kFloat && s.numel() == 1, op,
                  ": grad_scale should be a 1-element float32 tensor, got ", s.numel(), " ", s.scalar_type());
      TORCH_CHECK(s.device() == grad.device(), op, ": grad_scale should be on ", grad.device(), " like grad, got ",
                  s.device());
      fb.grad_scale = s.data_ptr<float>();
    }
  }
};

// The state a send step writes (residual / momentum at the candidates' indices).
inline Feedback send_state(const char* op, const c10::optional<at::Tensor>& residual,
                           const c10::optional<at::Tensor>& momentum, bool masking) {
  Feedback fb;
  fb.masking = masking;
  if (!residual.has_value() && !momentum.has_value()) return fb;
  const at::Tensor& like = residual.has_value() ? *residual : *momentum;
  fb.residual_out = state_ptr(op, "residual", like, residual);
  fb.momentum_out = state_ptr(op, "momentum", like, momentum);
  return fb;
}

// Index range check (CPU only: on CUDA it would need a host synchronisation).
inline void check_index_range(const char* op, const at::Tensor& index, int64_t numel) {
  if (index.numel() == 0) return;
  const int32_t* idx = index.data_ptr<int32_t>();
  const auto [lo, hi] = std::minmax_element(idx, idx + index.numel());
  TORCH_CHECK(*lo >= 0 && *hi < numel, op, ": index should be in [0, ", numel, "), got values in [", *lo, ", ", *hi,
              "]");
}

// send_state with the candidates' indices checked against the state (where Device can).
template <typename Device>
Feedback send_feedback(const char* op, const at::Tensor& index, const c10::optional<at::Tensor>& residual,
                       const c10::optional<at::Tensor>& momentum, bool masking) {
  const Feedback fb = send_state(op, residual, momentum, masking);
  if (fb.residual_out || fb.momentum_out) {
    Device::check_index_range(op, index, residual.has_value() ? residual->numel() : momentum->numel());
  }
  return fb;
}

inline void check_unpack_args(const at::Tensor& values, const at::Tensor& index, const at::Tensor& out) {
  TORCH_CHECK(values.dim() == 1, "sparse_unpack: values should be 1-D, got ", values.dim(), "-D");
  TORCH_CHECK(index.scalar_type() == at::kInt && index.dim() == 1,
              "sparse_unpack: index should be a 1-D int32 tensor, got ", index.dim(), "-D ", index.scalar_type());
  TORCH_CHECK(values.numel() == index.numel(), "sparse_unpack: values and index should have the same length, got ",
              values.numel(), " and ", index.numel());
  TORCH_CHECK(out.scalar_type() == values.scalar_type(), "sparse_unpack: out should be ", values.scalar_type(),
              " like values, got ", out.scalar_type());
  TORCH_CHECK(out.is_contiguous(), "sparse_unpack: out should be contiguous");
  TORCH_CHECK(out.device() == values.device() && index.device() == values.device(),
              "sparse_unpack: values, index and out should be on one device");
  check_indexable("sparse_unpack", out.numel());
}

// The scale of the unpack ops that take it as a tensor: *scale / divisor, read where the op runs.
inline UnpackScale unpack_scale(const char* op, const at::Tensor& scale, int64_t divisor, const at::Tensor& out) {
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == 1, op,
              ": scale should be a 1-element float32 tensor, got ", scale.numel(), " ", scale.scalar_type());
  TORCH_CHECK(scale.device() == out.device(), op, ": scale should be on out's device (", out.device(), "), got ",
              scale.device());
  TORCH_CHECK(divisor >= 1, op, ": divisor should be >= 1, got ", divisor);
  return UnpackScale(scale.data_ptr<float>(), divisor);
}

inline void check_stream_args(const char* op, int64_t tensor_id, int64_t step) {
  TORCH_CHECK(tensor_id >= 0 && tensor_id <= 0xffffffffLL, op, ": tensor_id should be a uint32, got ", tensor_id);
  TORCH_CHECK(step >= 0, op, ": step should be >= 0, got ", step);
}

inline SamplePlan checked_sample_plan(int64_t numel, double ratio, int64_t sample_count, int64_t seed,
                                      int64_t tensor_id, int64_t step) {
  TORCH_CHECK(ratio > 0.0 && ratio <= 1.0, "sample_threshold: ratio should be in (0, 1], got ", ratio);
  TORCH_CHECK(sample_count >= 1, "sample_threshold: sample_count should be >= 1, got ", sample_count);
  check_stream_args("sample_threshold", tensor_id, step);
  return plan_sample(numel, sample_count, ratio, uint64_t(seed), uint32_t(tensor_id), uint64_t(step));
}

inline Permutation checked_permutation(int64_t numel, int64_t k, int64_t seed, int64_t tensor_id, int64_t step) {
  check_indexable("random_k_indices", numel);
  TORCH_CHECK(k >= 0 && k <= numel, "random_k_indices: k should be in [0, numel=", numel, "], got ", k);
  check_stream_args("random_k_indices", tensor_id, step);
  return Permutation(uint64_t(seed), uint32_t(tensor_id), uint64_t(step), numel);
}

inline void check_bits(const char* op, int64_t bits) {
  TORCH_CHECK(bits == 1 || bits == 2, op, ": bits should be 1 or 2, got ", bits);
}

// codes and scales of `count` values of `bits` bits (send_quantized's outputs).
inline void check_quantized(const char* op, const at::Tensor& codes, const at::Tensor& scales, int64_t count,
                            int64_t bits) {
  check_bits(op, bits);
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.dim() == 1, op, ": codes should be a 1-D uint8 tensor, got ",
              codes.dim(), "-D ", codes.scalar_type());
  TORCH_CHECK(count >= 0 && codes.numel() == quantized_bytes(count, int(bits)), op, ": codes should have ",
              quantized_bytes(count, int(bits)), " bytes for ", count, " values of ", bits, " bits, got ",
              codes.numel());
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == quantized_scales(int(bits)), op,
              ": scales should be ", quantized_scales(int(bits)), " float32 values, got ", scales.numel(), " ",
              scales.scalar_type());
}

}  // namespace torch_binding
}  // namespace sparsecomm
