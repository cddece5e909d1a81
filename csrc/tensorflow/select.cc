// The select family's TF ops (csrc/kernels/feedback.h, sample.h, permutation.h) over
// csrc/cpu/select.cpp: the same launchers as the torch ops, so both frameworks give identical
// bits. Functional: residual and momentum come in and go out (0 elements: absent); an output
// reuses its input's buffer when TF can forward it, so the update is usually in place.
#include <algorithm>
#include <vector>

#include "common.h"
#include "../cpu/launchers.h"

namespace sparsecomm {
namespace tf_binding {
namespace {

// Output `output`: a vector holding data[0, n).
template <typename V>
absl::Status output_vector(OpKernelContext* c, int output, const V* data, int64_t n) {
  Tensor* t = nullptr;
  TF_RETURN_IF_ERROR(c->allocate_output(output, TensorShape({n}), &t));
  std::copy(data, data + n, t->flat<V>().data());
  return absl::OkStatus();
}

}  // namespace

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
    .SetShapeFn(shape_inference::ScalarShape);

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
    OP_REQUIRES_OK(c, state_input(c->input(1), numel, "residual", &fb.residual_in));
    OP_REQUIRES_OK(c, state_input(c->input(2), numel, "momentum", &fb.momentum_in));
    fb.momentum = momentum_factor_;
    int64_t seed, tensor_id, step;
    OP_REQUIRES_OK(c, scalar_inputs(c, 3, {"seed", "tensor_id", "step"}, {&seed, &tensor_id, &step}));
    OP_REQUIRES_OK(c, check_stream(tensor_id, step));
    OP_REQUIRES(c, TensorShapeUtils::IsScalar(c->input(6).shape()),
                invalid("ratio should be a scalar, got shape ", c->input(6).shape().DebugString()));
    const double ratio = c->input(6).scalar<double>()();
    OP_REQUIRES(c, ratio > 0.0 && ratio <= 1.0, invalid("ratio should be in (0, 1], got ", ratio));
    const SamplePlan plan = plan_sample(numel, sample_count_, ratio, uint64_t(seed), uint32_t(tensor_id),
                                        uint64_t(step));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({}), &out));
    out->scalar<float>()() = cpu::sample_threshold(raw<T>(grad), fb, numel, plan);
  }

 private:
  float momentum_factor_;
  int64_t sample_count_;
};
SC_REGISTER_FLOAT_KERNELS("SparsecommSampleThreshold", "T", SampleThresholdOp);

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
      TF_RETURN_IF_ERROR(unknown_vectors(c, 0, 2));
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
    OP_REQUIRES_OK(c, output_vector(c, 0, acc.data(), int64_t(acc.size())));
    OP_REQUIRES_OK(c, output_vector(c, 1, index.data(), int64_t(index.size())));
  }

 private:
  float momentum_factor_;
};
SC_REGISTER_FLOAT_KERNELS("SparsecommAccumulateCandidates", "T", AccumulateCandidatesOp);

// ---- SparsecommSelectTop ----
REGISTER_OP("SparsecommSelectTop")
    .Input("acc: float")
    .Input("index: int32")
    .Input("k: int64")
    .Output("acc_top: float")
    .Output("index_top: int32")
    .SetShapeFn([](InferenceContext* c) { return unknown_vectors(c, 0, 2); });

class SelectTopOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* c) override {
    const Tensor& acc = c->input(0);
    const Tensor& index = c->input(1);
    OP_REQUIRES_OK(c, check_pair(acc, index, "acc", "index"));
    int64_t k;
    OP_REQUIRES_OK(c, scalar_input(c, 2, "k", &k));
    OP_REQUIRES(c, k >= 0, invalid("k should be >= 0, got ", k));
    // cpu::select_top works in place: on copies, the inputs being read-only.
    std::vector<float> a(acc.flat<float>().data(), acc.flat<float>().data() + acc.NumElements());
    std::vector<int32_t> i(index.flat<int32_t>().data(), index.flat<int32_t>().data() + index.NumElements());
    const int64_t kept = cpu::select_top(a.data(), i.data(), int64_t(a.size()), k);
    OP_REQUIRES_OK(c, output_vector(c, 0, a.data(), kept));
    OP_REQUIRES_OK(c, output_vector(c, 1, i.data(), kept));
  }
};
REGISTER_KERNEL_BUILDER(Name("SparsecommSelectTop").Device(DEVICE_CPU), SelectTopOp);

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
  explicit SendSelectedOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("masking", &masking_));
  }
  void Compute(OpKernelContext* c) override {
    Feedback fb;
    OP_REQUIRES_OK(c, send_inputs(c, 1, masking_, &fb));
    const Tensor& acc = c->input(0);
    const Tensor& index = c->input(1);
    Tensor* values = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, acc.shape(), &values));
    cpu::send_selected(acc.flat<float>().data(), index.flat<int32_t>().data(), acc.NumElements(), fb, raw<T>(values));
  }

 private:
  bool masking_;
};
SC_REGISTER_FLOAT_KERNELS("SparsecommSendSelected", "dtype", SendSelectedOp);

// ---- SparsecommSparseUnpack ----
REGISTER_OP("SparsecommSparseUnpack")
    .Attr("T: {float, half, bfloat16}")
    .Attr("numel: int >= 0")
    .Attr("scale: float = 1.0")
    .Input("values: T")
    .Input("index: int32")
    .Output("dense: T")
    .SetShapeFn([](InferenceContext* c) { return vector_of_attr(c, 0, "numel"); });

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
    OP_REQUIRES_OK(c, check_pair(values, index, "values", "index"));
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
SC_REGISTER_FLOAT_KERNELS("SparsecommSparseUnpack", "T", SparseUnpackOp);

// ---- SparsecommRandomKIndices ----
REGISTER_OP("SparsecommRandomKIndices")
    .Input("seed: int64")
    .Input("tensor_id: int64")
    .Input("step: int64")
    .Input("numel: int64")
    .Input("k: int64")
    .Output("index: int32")
    .SetShapeFn([](InferenceContext* c) { return unknown_vectors(c, 0, 1); });

class RandomKIndicesOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* c) override {
    int64_t seed, tensor_id, step, numel, k;
    OP_REQUIRES_OK(c, scalar_inputs(c, 0, {"seed", "tensor_id", "step", "numel", "k"},
                                    {&seed, &tensor_id, &step, &numel, &k}));
    OP_REQUIRES_OK(c, check_indexable(numel));
    OP_REQUIRES(c, k >= 0 && k <= numel, invalid("k should be in [0, numel=", numel, "], got ", k));
    OP_REQUIRES_OK(c, check_stream(tensor_id, step));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({k}), &out));
    cpu::random_k_indices(Permutation(uint64_t(seed), uint32_t(tensor_id), uint64_t(step), numel), k,
                          out->flat<int32_t>().data());
  }
};
REGISTER_KERNEL_BUILDER(Name("SparsecommRandomKIndices").Device(DEVICE_CPU), RandomKIndicesOp);

}  // namespace tf_binding
}  // namespace sparsecomm
