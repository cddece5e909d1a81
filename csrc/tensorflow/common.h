// Shared by the TF op files: error helper, TF dtype -> framework-free storage type, raw
// pointers, scalar inputs.
#pragma once
#include "tensorflow/core/framework/op_kernel.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "../kernels/common.h"

namespace sparsecomm {
namespace tf_binding {

template <typename... Args>
absl::Status invalid(const Args&... args) { return absl::InvalidArgumentError(absl::StrCat(args...)); }

// TF element type -> framework-free storage type (same layout).
template <typename T> struct Storage;
template <> struct Storage<float> { using type = float; };
template <> struct Storage<Eigen::half> { using type = half16; };
template <> struct Storage<Eigen::bfloat16> { using type = bfloat16; };

template <typename T>
const typename Storage<T>::type* raw(const tensorflow::Tensor& t) {
  return reinterpret_cast<const typename Storage<T>::type*>(t.flat<T>().data());
}
template <typename T>
typename Storage<T>::type* raw(tensorflow::Tensor* t) {
  return reinterpret_cast<typename Storage<T>::type*>(t->flat<T>().data());
}

inline absl::Status scalar_input(tensorflow::OpKernelContext* c, int input, const char* name, int64_t* value) {
  const tensorflow::Tensor& t = c->input(input);
  if (!tensorflow::TensorShapeUtils::IsScalar(t.shape()))
    return invalid(name, " should be a scalar, got shape ", t.shape().DebugString());
  *value = t.scalar<int64_t>()();
  return absl::OkStatus();
}

}  // namespace tf_binding
}  // namespace sparsecomm
