// TensorFlow ops for selection with error feedback: the same csrc/cpu launchers as the torch
// ops (csrc/torch/cpu.cpp), so both frameworks give identical bits. Functional: residual and
// momentum come in and go out (0 elements: absent); an output reuses its input's buffer when
// TF can forward it, so the update is usually in place.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "common.h"
#include "../cpu/launchers.h"

namespace sparsecomm {
namespace tf_binding {

using namespace tensorflow;  // NOLINT: the REGISTER_* macros expect it
using shape_inference::InferenceContext;

// An optional float32 state (input `input`, output `output`): `numel` elements, or 0 for absent.
// copy: the output must start as the input (the op writes only some elements).
absl::Status state_io(OpKernelContext* c, int input, int output, int64_t numel, const char* name, bool copy,
                      const float** in, float** out) {
  const Tensor& t = c->input(input);
  *in = nullptr;
  *out = nullptr;
  if (t.NumElements() == 0) {
    Tensor* empty = nullptr;
    return c->allocate_output(output, t.shape(), &empty);
  }
  if (t.NumElements() != numel)
    return invalid(name, " should have ", numel, " elements (or 0: absent), got ", t.NumElements());
  Tensor* result = nullptr;
  TF_RETURN_IF_ERROR(c->forward_input_or_allocate_output({input}, output, t.shape(), &result));
  *in = t.flat<float>().data();
  *out = result->flat<float>().data();
  if (copy && *out != *in) std::copy(*in, *in + numel, *out);
  return absl::OkStatus();
}

absl::Status check_index(const Tensor& index, int64_t numel, const char* name) {
  const int32_t* idx = index.flat<int32_t>().data();
  if (index.NumElements() == 0) return absl::OkStatus();
  const auto [lo, hi] = std::minmax_element(idx, idx + index.NumElements());
  if (*lo < 0 || *hi >= numel)
    return invalid(name, " should be in [0, ", numel, "), got values in [", *lo, ", ", *hi, "]");
  return absl::OkStatus();
}

absl::Status check_indexable(int64_t numel) {
  if (numel >= (int64_t(1) << 31)) return invalid("tensors of at most 2^31 - 1 elements are supported, got ", numel);
  return absl::OkStatus();
}

absl::Status same_as_input(InferenceContext* c, int first_output, int first_input, int count) {
  for (int j = 0; j < count; ++j) c->set_output(first_output + j, c->input(first_input + j));
  return absl::OkStatus();
}

// ---- SparsecommSampleThreshold ----
REGISTER_OP("SparsecommSampleThreshold")
    .Attr("T: {float, half, bfloat16}")
    .Attr("momentum_factor: float = 0.0")
    .Attr("sample_count: int >= 1")
    .Input("grad: T")
    .Input("residual: float")
    .Input("momentum: float")
    .Input("seed: int64")
    .Input("tensor_id: int64")
    .Input("step: int64")
    .Input("ratio: double")  // an input, not an attr: attrs are float32, and ceil(ratio * count) needs the double
    .Output("threshold: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    });

template <typename T>
class SampleThresholdOp : public OpKernel {
 public:
  explicit SampleThresholdOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("momentum_factor", &momentum_factor_));
    OP_REQUIRES_OK(c, c->GetAttr("sample_count", &sample_count_));
  }
  void Compute(OpKernelContext* c) override {
    const Tensor& grad = c->input(0);
    const int64_t numel = grad.NumElements();
    Feedback fb;
    for (int i = 1; i <= 2; ++i) {
      const Tensor& s = c->input(i);
      OP_REQUIRES(c, s.NumElements() == 0 || s.NumElements() == numel,
                  invalid(i == 1 ? "residual" : "momentum", " should have ", numel, " elements (or 0: absent), got ",
                          s.NumElements()));
    }
    if (c->input(1).NumElements()) fb.residual_in = c->input(1).flat<float>().data();
    if (c->input(2).NumElements()) fb.momentum_in = c->input(2).flat<float>().data();
    fb.momentum = momentum_factor_;
    int64_t seed, tensor_id, step;
    OP_REQUIRES_OK(c, scalar_input(c, 3, "seed", &seed));
    OP_REQUIRES_OK(c, scalar_input(c, 4, "tensor_id", &tensor_id));
    OP_REQUIRES_OK(c, scalar_input(c, 5, "step", &step));
    OP_REQUIRES(c, tensor_id >= 0 && tensor_id <= 0xffffffffLL, invalid("tensor_id should be a uint32, got ", tensor_id));
    OP_REQUIRES(c, step >= 0, invalid("step should be >= 0, got ", step));
    OP_REQUIRES(c, TensorShapeUtils::IsScalar(c->input(6).shape()),
                invalid("ratio should be a scalar, got shape ", c->input(6).shape().DebugString()));
    const double ratio = c->input(6).scalar<double>()();
    OP_REQUIRES(c, ratio > 0.0 && ratio <= 1.0, invalid("ratio should be in (0, 1], got ", ratio));
    const SamplePlan plan = plan_sample(numel, sample_count_, ratio, uint64_t(seed), uint32_t(tensor_id), uint64_t(step));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({}), &out));
    out->scalar<float>()() = cpu::sample_threshold(raw<T>(grad), fb, numel, plan);
  }

 private:
  float momentum_factor_;
  int64_t sample_count_;
};

// ---- SparsecommAccumulateCandidates ----
REGISTER_OP("SparsecommAccumulateCandidates")
    .Attr("T: {float, half, bfloat16}")
    .Attr("momentum_factor: float = 0.0")
    .Input("grad: T")
    .Input("residual: float")
    .Input("momentum: float")
    .Input("threshold: float")
    .Output("acc: float")
    .Output("index: int32")
    .Output("residual_out: float")
    .Output("momentum_out: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      return same_as_input(c, 2, 1, 2);
    });

template <typename T>
class AccumulateCandidatesOp : public OpKernel {
 public:
  explicit AccumulateCandidatesOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("momentum_factor", &momentum_factor_));
  }
  void Compute(OpKernelContext* c) override {
    const Tensor& grad = c->input(0);
    const int64_t numel = grad.NumElements();
    OP_REQUIRES_OK(c, check_indexable(numel));
    OP_REQUIRES(c, c->input(3).NumElements() == 1,
                invalid("threshold should have one element, got ", c->input(3).NumElements()));
    Feedback fb;
    OP_REQUIRES_OK(c, state_io(c, 1, 2, numel, "residual", false, &fb.residual_in, &fb.residual_out));
    OP_REQUIRES_OK(c, state_io(c, 2, 3, numel, "momentum", false, &fb.momentum_in, &fb.momentum_out));
    fb.momentum = momentum_factor_;
    std::vector<float> acc;
    std::vector<int32_t> index;
    cpu::accumulate_candidates(raw<T>(grad), fb, numel, c->input(3).flat<float>()(0), acc, index);
    Tensor *acc_t = nullptr, *index_t = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({int64_t(acc.size())}), &acc_t));
    OP_REQUIRES_OK(c, c->allocate_output(1, TensorShape({int64_t(index.size())}), &index_t));
    std::copy(acc.begin(), acc.end(), acc_t->flat<float>().data());
    std::copy(index.begin(), index.end(), index_t->flat<int32_t>().data());
  }

 private:
  float momentum_factor_;
};

// ---- SparsecommSelectTop ----
REGISTER_OP("SparsecommSelectTop")
    .Input("acc: float")
    .Input("index: int32")
    .Input("k: int64")
    .Output("acc_top: float")
    .Output("index_top: int32")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    });

class SelectTopOp : public OpKernel {
 public:
  explicit SelectTopOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* c) override {
    const Tensor& acc = c->input(0);
    const Tensor& index = c->input(1);
    OP_REQUIRES(c, acc.dims() == 1 && index.dims() == 1 && acc.NumElements() == index.NumElements(),
                invalid("acc and index should be 1-D of the same length, got ", acc.shape().DebugString(), " and ",
                        index.shape().DebugString()));
    int64_t k;
    OP_REQUIRES_OK(c, scalar_input(c, 2, "k", &k));
    OP_REQUIRES(c, k >= 0, invalid("k should be >= 0, got ", k));
    std::vector<float> a(acc.flat<float>().data(), acc.flat<float>().data() + acc.NumElements());
    std::vector<int32_t> i(index.flat<int32_t>().data(), index.flat<int32_t>().data() + index.NumElements());
    const int64_t kept = cpu::select_top(a.data(), i.data(), int64_t(a.size()), k);
    Tensor *acc_t = nullptr, *index_t = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({kept}), &acc_t));
    OP_REQUIRES_OK(c, c->allocate_output(1, TensorShape({kept}), &index_t));
    std::copy(a.begin(), a.begin() + kept, acc_t->flat<float>().data());
    std::copy(i.begin(), i.begin() + kept, index_t->flat<int32_t>().data());
  }
};
REGISTER_KERNEL_BUILDER(Name("SparsecommSelectTop").Device(DEVICE_CPU), SelectTopOp);

// The state of a send step: residual / momentum copied through, written at the candidates.
absl::Status send_state(OpKernelContext* c, const Tensor& index, int first_input, int first_output, bool masking,
                        Feedback* fb) {
  const int64_t numel = std::max(c->input(first_input).NumElements(), c->input(first_input + 1).NumElements());
  const float* unused;
  TF_RETURN_IF_ERROR(state_io(c, first_input, first_output, numel, "residual", true, &unused, &fb->residual_out));
  TF_RETURN_IF_ERROR(state_io(c, first_input + 1, first_output + 1, numel, "momentum", true, &unused,
                              &fb->momentum_out));
  fb->masking = masking;
  return (fb->residual_out || fb->momentum_out) ? check_index(index, numel, "index") : absl::OkStatus();
}

absl::Status check_candidates(const Tensor& acc, const Tensor& index) {
  if (acc.dims() != 1 || index.dims() != 1 || acc.NumElements() != index.NumElements())
    return invalid("acc and index should be 1-D of the same length, got ", acc.shape().DebugString(), " and ",
                   index.shape().DebugString());
  return absl::OkStatus();
}

// ---- SparsecommSendSelected ----
REGISTER_OP("SparsecommSendSelected")
    .Attr("dtype: {float, half, bfloat16}")
    .Attr("masking: bool = true")
    .Input("acc: float")
    .Input("index: int32")
    .Input("residual: float")
    .Input("momentum: float")
    .Output("values: dtype")
    .Output("residual_out: float")
    .Output("momentum_out: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return same_as_input(c, 1, 2, 2);
    });

template <typename T>
class SendSelectedOp : public OpKernel {
 public:
  explicit SendSelectedOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, c->GetAttr("masking", &masking_)); }
  void Compute(OpKernelContext* c) override {
    const Tensor& acc = c->input(0);
    const Tensor& index = c->input(1);
    OP_REQUIRES_OK(c, check_candidates(acc, index));
    Feedback fb;
    OP_REQUIRES_OK(c, send_state(c, index, 2, 1, masking_, &fb));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, acc.shape(), &values));
    cpu::send_selected(acc.flat<float>().data(), index.flat<int32_t>().data(), acc.NumElements(), fb, raw<T>(values));
  }

 private:
  bool masking_;
};

// ---- SparsecommSendQuantized / SparsecommDequantize ----
REGISTER_OP("SparsecommSendQuantized")
    .Attr("bits: int")
    .Attr("masking: bool = true")
    .Input("acc: float")
    .Input("index: int32")
    .Input("residual: float")
    .Input("momentum: float")
    .Output("codes: uint8")
    .Output("scales: float")
    .Output("residual_out: float")
    .Output("momentum_out: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      return same_as_input(c, 2, 2, 2);
    });

class SendQuantizedOp : public OpKernel {
 public:
  explicit SendQuantizedOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("bits", &bits_));
    OP_REQUIRES_OK(c, c->GetAttr("masking", &masking_));
    OP_REQUIRES(c, bits_ == 1 || bits_ == 2, invalid("bits should be 1 or 2, got ", bits_));
  }
  void Compute(OpKernelContext* c) override {
    const Tensor& acc = c->input(0);
    const Tensor& index = c->input(1);
    OP_REQUIRES_OK(c, check_candidates(acc, index));
    Feedback fb;
    OP_REQUIRES_OK(c, send_state(c, index, 2, 2, masking_, &fb));
    Tensor *codes = nullptr, *scales = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({quantized_bytes(acc.NumElements(), bits_)}), &codes));
    OP_REQUIRES_OK(c, c->allocate_output(1, TensorShape({quantized_scales(bits_)}), &scales));
    cpu::send_quantized(acc.flat<float>().data(), index.flat<int32_t>().data(), acc.NumElements(), fb, bits_,
                        codes->flat<uint8_t>().data(), scales->flat<float>().data());
  }

 private:
  int bits_;
  bool masking_;
};
REGISTER_KERNEL_BUILDER(Name("SparsecommSendQuantized").Device(DEVICE_CPU), SendQuantizedOp);

REGISTER_OP("SparsecommDequantize")
    .Attr("bits: int")
    .Input("codes: uint8")
    .Input("scales: float")
    .Input("count: int64")
    .Output("values: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    });

class DequantizeOp : public OpKernel {
 public:
  explicit DequantizeOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("bits", &bits_));
    OP_REQUIRES(c, bits_ == 1 || bits_ == 2, invalid("bits should be 1 or 2, got ", bits_));
  }
  void Compute(OpKernelContext* c) override {
    const Tensor& codes = c->input(0);
    const Tensor& scales = c->input(1);
    int64_t count;
    OP_REQUIRES_OK(c, scalar_input(c, 2, "count", &count));
    OP_REQUIRES(c, count >= 0 && codes.NumElements() == quantized_bytes(count, bits_),
                invalid("codes should have ", quantized_bytes(count, bits_), " bytes for ", count, " values of ", bits_,
                        " bits, got ", codes.NumElements()));
    OP_REQUIRES(c, scales.NumElements() == quantized_scales(bits_),
                invalid("scales should be ", quantized_scales(bits_), " values, got ", scales.NumElements()));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({count}), &values));
    cpu::dequantize(codes.flat<uint8_t>().data(), scales.flat<float>().data(), count, bits_,
                    values->flat<float>().data());
  }

 private:
  int bits_;
};
REGISTER_KERNEL_BUILDER(Name("SparsecommDequantize").Device(DEVICE_CPU), DequantizeOp);

// ---- SparsecommSparseUnpack ----
REGISTER_OP("SparsecommSparseUnpack")
    .Attr("T: {float, half, bfloat16}")
    .Attr("numel: int >= 0")
    .Attr("scale: float = 1.0")
    .Input("values: T")
    .Input("index: int32")
    .Output("dense: T")
    .SetShapeFn([](InferenceContext* c) {
      int64_t numel;
      TF_RETURN_IF_ERROR(c->GetAttr("numel", &numel));
      c->set_output(0, c->Vector(numel));
      return absl::OkStatus();
    });

template <typename T>
class SparseUnpackOp : public OpKernel {
 public:
  explicit SparseUnpackOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("numel", &numel_));
    OP_REQUIRES_OK(c, c->GetAttr("scale", &scale_));
    OP_REQUIRES_OK(c, check_indexable(numel_));
  }
  void Compute(OpKernelContext* c) override {
    const Tensor& values = c->input(0);
    const Tensor& index = c->input(1);
    OP_REQUIRES(c, values.dims() == 1 && index.dims() == 1 && values.NumElements() == index.NumElements(),
                invalid("values and index should be 1-D of the same length, got ", values.shape().DebugString(),
                        " and ", index.shape().DebugString()));
    OP_REQUIRES_OK(c, check_index(index, numel_, "index"));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({numel_}), &dense));
    cpu::sparse_unpack(raw<T>(values), index.flat<int32_t>().data(), values.NumElements(), scale_, numel_,
                       raw<T>(dense));
  }

 private:
  int64_t numel_;
  float scale_;
};

// ---- SparsecommRandomKIndices ----
REGISTER_OP("SparsecommRandomKIndices")
    .Input("seed: int64")
    .Input("tensor_id: int64")
    .Input("step: int64")
    .Input("numel: int64")
    .Input("k: int64")
    .Output("index: int32")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    });

class RandomKIndicesOp : public OpKernel {
 public:
  explicit RandomKIndicesOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* c) override {
    int64_t seed, tensor_id, step, numel, k;
    OP_REQUIRES_OK(c, scalar_input(c, 0, "seed", &seed));
    OP_REQUIRES_OK(c, scalar_input(c, 1, "tensor_id", &tensor_id));
    OP_REQUIRES_OK(c, scalar_input(c, 2, "step", &step));
    OP_REQUIRES_OK(c, scalar_input(c, 3, "numel", &numel));
    OP_REQUIRES_OK(c, scalar_input(c, 4, "k", &k));
    OP_REQUIRES_OK(c, check_indexable(numel));
    OP_REQUIRES(c, k >= 0 && k <= numel, invalid("k should be in [0, numel=", numel, "], got ", k));
    OP_REQUIRES(c, tensor_id >= 0 && tensor_id <= 0xffffffffLL, invalid("tensor_id should be a uint32, got ", tensor_id));
    OP_REQUIRES(c, step >= 0, invalid("step should be >= 0, got ", step));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({k}), &out));
    cpu::random_k_indices(Permutation(uint64_t(seed), uint32_t(tensor_id), uint64_t(step), numel), k,
                          out->flat<int32_t>().data());
  }
};
REGISTER_KERNEL_BUILDER(Name("SparsecommRandomKIndices").Device(DEVICE_CPU), RandomKIndicesOp);

#define SC_REGISTER(T)                                                                                         \
  REGISTER_KERNEL_BUILDER(Name("SparsecommSampleThreshold").Device(DEVICE_CPU).TypeConstraint<T>("T"),         \
                          SampleThresholdOp<T>);                                                               \
  REGISTER_KERNEL_BUILDER(Name("SparsecommAccumulateCandidates").Device(DEVICE_CPU).TypeConstraint<T>("T"),    \
                          AccumulateCandidatesOp<T>);                                                          \
  REGISTER_KERNEL_BUILDER(Name("SparsecommSendSelected").Device(DEVICE_CPU).TypeConstraint<T>("dtype"),        \
                          SendSelectedOp<T>);                                                                  \
  REGISTER_KERNEL_BUILDER(Name("SparsecommSparseUnpack").Device(DEVICE_CPU).TypeConstraint<T>("T"),            \
                          SparseUnpackOp<T>);
SC_REGISTER(float)
SC_REGISTER(Eigen::half)
SC_REGISTER(Eigen::bfloat16)
#undef SC_REGISTER

}  // namespace tf_binding
}  // namespace sparsecomm
