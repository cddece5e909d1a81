// Shared by the TF op families (block.cc, select.cc, quantize.cc): errors, TF dtype ->
// framework-free storage type, raw pointers, scalar and state inputs, the checks and shape
// functions more than one op uses, and the float kernel registration.
//
// Each OpKernel is written once over a device policy `Device` (CpuDevice in cpu.h; GpuDevice
// in gpu.h, compiled only with GOOGLE_CUDA), constructed in Compute from the OpKernelContext.
// Every member returns absl::Status:
//   check_index(index, numel, name)  (a no-op on the GPU: it would need a host synchronisation)
//   copy(from, n, to)                float32 state, within the device
//   the launchers with csrc/cpu/launchers.h's arguments (GPU: on TF's stream), SC_FORWARDED_LAUNCHERS:
//     block_pack, block_unpack, send_selected, accumulate, momentum_step, sum_of_squares, send_quantized,
//     dequantize
//   the steps that differ by device, over tensors (each says why where it is defined):
//     sample_threshold<T>, accumulate_candidates<T> (allocates outputs 0 and 1), select_top
//     and select_every<T> (likewise), sparse_unpack<T>, random_k_indices
//   CpuDevice only: wire_rows, wire_columns<T> (allocates outputs 0 and 1); their GPU kernels
//   run them on host memory (select.cc says why)
#pragma once
#include <algorithm>
#include <initializer_list>

#include "../kernels/common.h"
#include "../kernels/feedback.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sparsecomm {
namespace tf_binding {

using namespace tensorflow;  // NOLINT: the REGISTER_* macros expect it
using shape_inference::InferenceContext;

template <typename... Args>
absl::Status invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// TF element type -> framework-free storage type (same layout).
template <typename T>
struct Storage;
template <>
struct Storage<float> {
  using type = float;
};
template <>
struct Storage<Eigen::half> {
  using type = half16;
};
template <>
struct Storage<Eigen::bfloat16> {
  using type = bfloat16;
};

template <typename T>
const typename Storage<T>::type* raw(const Tensor& t) {
  return reinterpret_cast<const typename Storage<T>::type*>(t.flat<T>().data());
}
template <typename T>
typename Storage<T>::type* raw(Tensor* t) {
  return reinterpret_cast<typename Storage<T>::type*>(t->flat<T>().data());
}

// The float kernels Kernel<Device, T> of a kernel builder (Name(...).Device(...)), T = float,
// half, bfloat16 bound to its type attr `attr`.
#define SC_REGISTER_FLOAT_KERNELS(builder, attr, Kernel, Device)                                   \
  REGISTER_KERNEL_BUILDER(builder.TypeConstraint<float>(attr), Kernel<Device, float>);             \
  REGISTER_KERNEL_BUILDER(builder.TypeConstraint<Eigen::half>(attr), Kernel<Device, Eigen::half>); \
  REGISTER_KERNEL_BUILDER(builder.TypeConstraint<Eigen::bfloat16>(attr), Kernel<Device, Eigen::bfloat16>)

// The launchers a device policy forwards as they are (cpu.h, gpu.h): X(name) for each.
#define SC_FORWARDED_LAUNCHERS(X) \
  X(block_pack)                   \
  X(block_unpack)                 \
  X(send_selected)                \
  X(accumulate)                   \
  X(momentum_step)                \
  X(sum_of_squares)               \
  X(send_quantized)               \
  X(dequantize)

// ---- Inputs ----

inline absl::Status scalar_input(OpKernelContext* c, int input, const char* name, int64_t* value) {
  const Tensor& t = c->input(input);
  if (!TensorShapeUtils::IsScalar(t.shape()))
    return invalid(name, " should be a scalar, got shape ", t.shape().DebugString());
  *value = t.scalar<int64_t>()();
  return absl::OkStatus();
}

// The int64 scalar inputs first, first + 1, ... (one name and one destination each).
inline absl::Status scalar_inputs(OpKernelContext* c, int first, std::initializer_list<const char*> names,
                                  std::initializer_list<int64_t*> values) {
  int input = first;
  int64_t* const* value = values.begin();
  for (const char* name : names) TF_RETURN_IF_ERROR(scalar_input(c, input++, name, *value++));
  return absl::OkStatus();
}

// An optional float32 state input: `numel` elements, or 0 for absent (*in = nullptr).
inline absl::Status state_input(const Tensor& t, int64_t numel, const char* name, const float** in) {
  *in = nullptr;
  if (t.NumElements() == 0) return absl::OkStatus();
  if (t.NumElements() != numel)
    return invalid(name, " should have ", numel, " elements (or 0: absent), got ", t.NumElements());
  *in = t.flat<float>().data();
  return absl::OkStatus();
}

// The optional gradient scale (feedback.h's grad_scale): 1 float32 element, read where the
// kernel runs, or 0 for none.
inline absl::Status grad_scale_input(const Tensor& t, const float** scale) {
  *scale = nullptr;
  if (t.NumElements() == 0) return absl::OkStatus();
  if (t.NumElements() != 1) return invalid("grad_scale should have 1 element (or 0: none), got ", t.NumElements());
  *scale = t.flat<float>().data();
  return absl::OkStatus();
}

// An optional float32 state (input `input`, output `output`; absent: empty output, nullptr).
// The output reuses the input's buffer when TF can forward it. copy: the output must start as
// the input (the op writes only some elements).
template <typename Device>
absl::Status state_io(OpKernelContext* c, const Device& dev, int input, int output, int64_t numel, const char* name,
                      bool copy, const float** in, float** out) {
  const Tensor& t = c->input(input);
  *out = nullptr;
  TF_RETURN_IF_ERROR(state_input(t, numel, name, in));
  Tensor* result = nullptr;
  if (*in == nullptr) return c->allocate_output(output, t.shape(), &result);
  TF_RETURN_IF_ERROR(c->forward_input_or_allocate_output({input}, output, t.shape(), &result));
  *out = result->flat<float>().data();
  return copy && *out != *in ? dev.copy(*in, numel, *out) : absl::OkStatus();
}

// ---- Checks ----

// Reads the indices: on the host only (CpuDevice::check_index).
inline absl::Status check_index(const Tensor& index, int64_t numel, const char* name) {
  const int32_t* idx = index.flat<int32_t>().data();
  if (index.NumElements() == 0) return absl::OkStatus();
  const auto [lo, hi] = std::minmax_element(idx, idx + index.NumElements());
  if (*lo < 0 || *hi >= numel)
    return invalid(name, " should be in [0, ", numel, "), got values in [", *lo, ", ", *hi, "]");
  return absl::OkStatus();
}

inline absl::Status check_indexable(int64_t numel) {
  if (numel >= (int64_t(1) << 31)) return invalid("tensors of at most 2^31 - 1 elements are supported, got ", numel);
  return absl::OkStatus();
}

// Two inputs that go together (acc and index, values and index): 1-D, of the same length.
inline absl::Status check_pair(const Tensor& a, const Tensor& b, const char* a_name, const char* b_name) {
  if (a.dims() != 1 || b.dims() != 1 || a.NumElements() != b.NumElements())
    return invalid(a_name, " and ", b_name, " should be 1-D of the same length, got ", a.shape().DebugString(), " and ",
                   b.shape().DebugString());
  return absl::OkStatus();
}

// The (tensor_id, step) of a selection stream (csrc/kernels/philox.h).
inline absl::Status check_stream(int64_t tensor_id, int64_t step) {
  if (tensor_id < 0 || tensor_id > 0xffffffffLL) return invalid("tensor_id should be a uint32, got ", tensor_id);
  if (step < 0) return invalid("step should be >= 0, got ", step);
  return absl::OkStatus();
}

// A send step's inputs (acc, index, residual, momentum), checked, and the state it writes:
// residual and momentum copied through to outputs first_output, +1 and written at the
// candidates, whose indices are checked against them.
template <typename Device>
absl::Status send_inputs(OpKernelContext* c, const Device& dev, int first_output, bool masking, Feedback* fb) {
  const Tensor& index = c->input(1);
  TF_RETURN_IF_ERROR(check_pair(c->input(0), index, "acc", "index"));
  const int64_t numel = std::max(c->input(2).NumElements(), c->input(3).NumElements());
  const float* unused;
  TF_RETURN_IF_ERROR(state_io(c, dev, 2, first_output, numel, "residual", true, &unused, &fb->residual_out));
  TF_RETURN_IF_ERROR(state_io(c, dev, 3, first_output + 1, numel, "momentum", true, &unused, &fb->momentum_out));
  fb->masking = masking;
  return (fb->residual_out || fb->momentum_out) ? dev.check_index(index, numel, "index") : absl::OkStatus();
}

// ---- Shape functions ----

// Outputs first .. first + count - 1: vectors whose length depends on the data.
inline absl::Status unknown_vectors(InferenceContext* c, int first, int count) {
  for (int j = 0; j < count; ++j) c->set_output(first + j, c->Vector(InferenceContext::kUnknownDim));
  return absl::OkStatus();
}

// Output `output`: a vector whose length is the int attr `attr`.
inline absl::Status vector_of_attr(InferenceContext* c, int output, const char* attr) {
  int64_t length;
  TF_RETURN_IF_ERROR(c->GetAttr(attr, &length));
  c->set_output(output, c->Vector(length));
  return absl::OkStatus();
}

// Outputs first_output, ...: the shapes of inputs first_input, ... (count of each).
inline absl::Status same_as_input(InferenceContext* c, int first_output, int first_input, int count) {
  for (int j = 0; j < count; ++j) c->set_output(first_output + j, c->input(first_input + j));
  return absl::OkStatus();
}

}  // namespace tf_binding
}  // namespace sparsecomm
