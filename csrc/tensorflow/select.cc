// The select family's TF ops (csrc/kernels/feedback.h, sample.h, permutation.h) over
// csrc/cpu/select.cpp and csrc/cuda/select.cu, sort.cu: the same launchers as the torch ops,
// so both frameworks give identical bits. Functional: residual and momentum come in and go out
// (0 elements: absent); an output reuses its input's buffer when TF can forward it, so the
// update is usually in place.
#include <cmath>
#include <string>

#include "common.h"
#include "cpu.h"
#if GOOGLE_CUDA
#include "gpu.h"
#endif

namespace sparsecomm {
namespace tf_binding {
namespace {

// The ops that accumulate a gradient into the state: their momentum attrs (nesterov where the
// op has it), as a Feedback whose state each op fills in.
class FeedbackOp : public OpKernel {
 public:
  explicit FeedbackOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("momentum_factor", &attrs_.momentum));
    if (c->HasAttr("nesterov")) OP_REQUIRES_OK(c, c->GetAttr("nesterov", &attrs_.nesterov));
  }

 protected:
  Feedback attrs_;
};

// The residual and momentum (inputs 1, 2) of a feedback op, to outputs first_output, +1 (state_io).
template <typename Device>
absl::Status feedback_io(OpKernelContext* c, const Device& dev, int first_output, int64_t numel, Feedback* fb) {
  TF_RETURN_IF_ERROR(state_io(c, dev, 1, first_output, numel, "residual", false, &fb->residual_in, &fb->residual_out));
  return state_io(c, dev, 2, first_output + 1, numel, "momentum", false, &fb->momentum_in, &fb->momentum_out);
}

}  // namespace

// ---- SparsecommSampleThreshold ----
REGISTER_OP("SparsecommSampleThreshold")
    .Attr("T: {float, half, bfloat16}")
    .Attr("momentum_factor: float = 0.0")
    .Attr("nesterov: bool = false")  // csrc/kernels/feedback.h, with a momentum only
    .Attr("sample_count: int >= 1")
    .Input("grad: T")
    .Input("residual: float")
    .Input("momentum: float")
    .Input("seed: int64")
    .Input("tensor_id: int64")
    .Input("step: int64")
    .Input("ratio: double")      // an input, not an attr: attrs are float32, and ceil(ratio * count) needs the double
    .Input("grad_scale: float")  // 1 element: grad is read times it (DGC's clipping factor); 0: none
    .Output("threshold: float")
    .SetShapeFn(shape_inference::ScalarShape);

template <typename Device, typename T>
class SampleThresholdOp : public FeedbackOp {
 public:
  explicit SampleThresholdOp(OpKernelConstruction* c) : FeedbackOp(c) {
    OP_REQUIRES_OK(c, c->GetAttr("sample_count", &sample_count_));
  }
  void Compute(OpKernelContext* c) override {
    const Tensor& grad = c->input(0);
    const int64_t numel = grad.NumElements();
    Feedback fb = attrs_;
    OP_REQUIRES_OK(c, state_input(c->input(1), numel, "residual", &fb.residual_in));
    OP_REQUIRES_OK(c, state_input(c->input(2), numel, "momentum", &fb.momentum_in));
    OP_REQUIRES(c, !fb.nesterov || fb.momentum_in, invalid("nesterov needs a momentum, got none"));
    OP_REQUIRES_OK(c, grad_scale_input(c->input(7), &fb.grad_scale));
    int64_t seed, tensor_id, step;
    OP_REQUIRES_OK(c, scalar_inputs(c, 3, {"seed", "tensor_id", "step"}, {&seed, &tensor_id, &step}));
    OP_REQUIRES_OK(c, check_stream(tensor_id, step));
    OP_REQUIRES(c, TensorShapeUtils::IsScalar(c->input(6).shape()),
                invalid("ratio should be a scalar, got shape ", c->input(6).shape().DebugString()));
    const double ratio = c->input(6).scalar<double>()();
    OP_REQUIRES(c, ratio > 0.0 && ratio <= 1.0, invalid("ratio should be in (0, 1], got ", ratio));
    const SamplePlan plan =
        plan_sample(numel, sample_count_, ratio, uint64_t(seed), uint32_t(tensor_id), uint64_t(step));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({}), &out));
    OP_REQUIRES_OK(c, Device(c).template sample_threshold<T>(grad, fb, plan, out));
  }

 private:
  int64_t sample_count_;
};
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommSampleThreshold").Device(DEVICE_CPU), "T", SampleThresholdOp, CpuDevice);

// ---- SparsecommAccumulateCandidates ----
REGISTER_OP("SparsecommAccumulateCandidates")
    .Attr("T: {float, half, bfloat16}")
    .Attr("momentum_factor: float = 0.0")
    .Attr("nesterov: bool = false")  // needs a residual and a momentum
    .Input("grad: T")
    .Input("residual: float")
    .Input("momentum: float")
    .Input("threshold: float")
    .Input("grad_scale: float")  // as SparsecommSampleThreshold's; needs a residual or a momentum
    .Output("acc: float")
    .Output("index: int32")
    .Output("residual_out: float")
    .Output("momentum_out: float")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(unknown_vectors(c, 0, 2));
      return same_as_input(c, 2, 1, 2);
    });

template <typename Device, typename T>
class AccumulateCandidatesOp : public FeedbackOp {
 public:
  using FeedbackOp::FeedbackOp;
  void Compute(OpKernelContext* c) override {
    const Tensor& grad = c->input(0);
    const int64_t numel = grad.NumElements();
    OP_REQUIRES_OK(c, check_indexable(numel));
    OP_REQUIRES(c, c->input(3).NumElements() == 1,
                invalid("threshold should have one element, got ", c->input(3).NumElements()));
    const Device dev(c);
    Feedback fb = attrs_;
    OP_REQUIRES_OK(c, feedback_io(c, dev, 2, numel, &fb));
    OP_REQUIRES_OK(c, grad_scale_input(c->input(4), &fb.grad_scale));
    // (the candidates' acc is read back from the state the pass wrote, not from grad)
    OP_REQUIRES(c, !fb.grad_scale || fb.residual_out || fb.momentum_out,
                invalid("grad_scale needs a residual or a momentum, got neither"));
    // (and Nesterov's acc is not the momentum: it is read back from the residual)
    OP_REQUIRES(c, !fb.nesterov || (fb.residual_out && fb.momentum_out),
                invalid("nesterov needs a residual and a momentum"));
    OP_REQUIRES_OK(c, dev.template accumulate_candidates<T>(grad, fb, c->input(3)));
  }
};
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommAccumulateCandidates").Device(DEVICE_CPU), "T", AccumulateCandidatesOp,
                          CpuDevice);

// ---- SparsecommAccumulate ----
// AccumulateCandidates with nothing selected (random-k's pass before its gather): no output whose
// size depends on the data, so the GPU is not waited for.
REGISTER_OP("SparsecommAccumulate")
    .Attr("T: {float, half, bfloat16}")
    .Attr("momentum_factor: float = 0.0")
    .Input("grad: T")
    .Input("residual: float")
    .Input("momentum: float")
    .Output("residual_out: float")
    .Output("momentum_out: float")
    .SetShapeFn([](InferenceContext* c) { return same_as_input(c, 0, 1, 2); });

template <typename Device, typename T>
class AccumulateOp : public FeedbackOp {
 public:
  using FeedbackOp::FeedbackOp;
  void Compute(OpKernelContext* c) override {
    const Tensor& grad = c->input(0);
    const int64_t numel = grad.NumElements();
    OP_REQUIRES_OK(c, check_indexable(numel));
    const Device dev(c);
    Feedback fb = attrs_;
    OP_REQUIRES_OK(c, feedback_io(c, dev, 0, numel, &fb));
    OP_REQUIRES_OK(c, dev.accumulate(raw<T>(grad), fb, numel));
  }
};
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommAccumulate").Device(DEVICE_CPU), "T", AccumulateOp, CpuDevice);

// ---- SparsecommMomentumStep ----
// DGC's dense route, one pass: u = momentum_factor * momentum + grad is the new momentum and,
// rounded to T, what is reduced (in grad's buffer when TF can forward it).
REGISTER_OP("SparsecommMomentumStep")
    .Attr("T: {float, half, bfloat16}")
    .Attr("momentum_factor: float")
    .Attr("nesterov: bool = false")  // u = momentum_factor * (momentum + grad), and the payload u + grad
    .Input("grad: T")
    .Input("momentum: float")
    .Input("grad_scale: float")  // as SparsecommSampleThreshold's
    .Output("payload: T")
    .Output("momentum_out: float")
    .SetShapeFn([](InferenceContext* c) { return same_as_input(c, 0, 0, 2); });

template <typename Device, typename T>
class MomentumStepOp : public FeedbackOp {
 public:
  using FeedbackOp::FeedbackOp;
  void Compute(OpKernelContext* c) override {
    const Tensor& grad = c->input(0);
    const int64_t numel = grad.NumElements();
    OP_REQUIRES_OK(c, check_indexable(numel));
    OP_REQUIRES(c, c->input(1).NumElements() == numel,
                invalid("momentum should have ", numel, " elements like grad, got ", c->input(1).NumElements()));
    const Device dev(c);
    Feedback fb = attrs_;
    OP_REQUIRES_OK(c, state_io(c, dev, 1, 1, numel, "momentum", false, &fb.momentum_in, &fb.momentum_out));
    OP_REQUIRES_OK(c, grad_scale_input(c->input(2), &fb.grad_scale));
    Tensor* payload = nullptr;
    OP_REQUIRES_OK(c, c->forward_input_or_allocate_output({0}, 0, grad.shape(), &payload));
    OP_REQUIRES_OK(c, dev.momentum_step(raw<T>(grad), fb, numel, raw<T>(payload)));
  }
};
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommMomentumStep").Device(DEVICE_CPU), "T", MomentumStepOp, CpuDevice);

// ---- SparsecommSumOfSquares ----
// The sum of the squares of x in float64, one read, in csrc/kernels/squares.h's fixed order:
// DGC's clipping norm squared, without a float32 copy of a 16-bit gradient.
REGISTER_OP("SparsecommSumOfSquares")
    .Attr("T: {float, half, bfloat16}")
    .Input("x: T")
    .Output("sum: double")
    .SetShapeFn(shape_inference::ScalarShape);

template <typename Device, typename T>
class SumOfSquaresOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* c) override {
    const Tensor& x = c->input(0);
    const int64_t numel = x.NumElements();
    Tensor tile_sums;
    OP_REQUIRES_OK(c, c->allocate_temp(DT_DOUBLE, TensorShape({square_tiles(numel)}), &tile_sums));
    Tensor* sum = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({}), &sum));
    OP_REQUIRES_OK(
        c, Device(c).sum_of_squares(raw<T>(x), numel, tile_sums.flat<double>().data(), sum->flat<double>().data()));
  }
};
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommSumOfSquares").Device(DEVICE_CPU), "T", SumOfSquaresOp, CpuDevice);

// ---- SparsecommSelectTop ----
REGISTER_OP("SparsecommSelectTop")
    .Input("acc: float")
    .Input("index: int32")
    .Input("k: int64")
    .Output("acc_top: float")
    .Output("index_top: int32")
    .SetShapeFn([](InferenceContext* c) { return unknown_vectors(c, 0, 2); });

template <typename Device>
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
    OP_REQUIRES_OK(c, Device(c).select_top(acc, index, k));
  }
};
REGISTER_KERNEL_BUILDER(Name("SparsecommSelectTop").Device(DEVICE_CPU), SelectTopOp<CpuDevice>);

// ---- SparsecommSelectBand ----
// A sampled selection brought into its band (sparsecomm/core/packing.py, Plan) in one op, not a
// tf.cond, whose two branch functions cost a graph more than the ops in them: fewer than too_few
// candidates, the top k of every element of `every` (the tensor that holds each element's acc; a
// second, read-only pass); more than too_many, the top k of the candidates; else the candidates.
REGISTER_OP("SparsecommSelectBand")
    .Attr("T: {float, half, bfloat16}")
    .Attr("k: int >= 0")
    .Attr("too_few: int")
    .Attr("too_many: int")
    .Input("acc: float")
    .Input("index: int32")
    .Input("every: T")
    .Output("acc_out: float")
    .Output("index_out: int32")
    .SetShapeFn([](InferenceContext* c) { return unknown_vectors(c, 0, 2); });

template <typename Device, typename T>
class SelectBandOp : public OpKernel {
 public:
  explicit SelectBandOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("k", &k_));
    OP_REQUIRES_OK(c, c->GetAttr("too_few", &too_few_));
    OP_REQUIRES_OK(c, c->GetAttr("too_many", &too_many_));
  }
  void Compute(OpKernelContext* c) override {
    const Tensor& acc = c->input(0);
    const Tensor& index = c->input(1);
    OP_REQUIRES_OK(c, check_pair(acc, index, "acc", "index"));
    const int64_t count = acc.NumElements();  // known on the host: no device is waited for
    if (count < too_few_) {
      OP_REQUIRES_OK(c, check_indexable(c->input(2).NumElements()));
      OP_REQUIRES_OK(c, Device(c).template select_every<T>(c->input(2), k_));
    } else if (count > too_many_) {
      OP_REQUIRES_OK(c, Device(c).select_top(acc, index, k_));
    } else {
      c->set_output(0, acc);
      c->set_output(1, index);
    }
  }

 private:
  int64_t k_, too_few_, too_many_;
};
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommSelectBand").Device(DEVICE_CPU), "T", SelectBandOp, CpuDevice);

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

template <typename Device, typename T>
class SendSelectedOp : public OpKernel {
 public:
  explicit SendSelectedOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("masking", &masking_));
  }
  void Compute(OpKernelContext* c) override {
    const Device dev(c);
    Feedback fb;
    OP_REQUIRES_OK(c, send_inputs(c, dev, 1, masking_, &fb));
    const Tensor& acc = c->input(0);
    const Tensor& index = c->input(1);
    Tensor* values = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, acc.shape(), &values));
    OP_REQUIRES_OK(c, dev.send_selected(acc.flat<float>().data(), index.flat<int32_t>().data(), acc.NumElements(), fb,
                                        raw<T>(values)));
  }

 private:
  bool masking_;
};
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommSendSelected").Device(DEVICE_CPU), "dtype", SendSelectedOp, CpuDevice);

// ---- SparsecommSparseUnpack ----
// dense = T(scale / divisor * the sum of the values at each index, in float32). scale is a
// 1-element tensor read where the kernel runs (Horovod's reduced placeholder stays on the GPU),
// divided by divisor in double (csrc/kernels/common.h: UnpackScale), as the torch ops do.
REGISTER_OP("SparsecommSparseUnpack")
    .Attr("T: {float, half, bfloat16}")
    .Attr("numel: int >= 0")
    .Attr("divisor: int >= 1 = 1")
    .Input("values: T")
    .Input("index: int32")
    .Input("scale: float")
    .Output("dense: T")
    .SetShapeFn([](InferenceContext* c) { return vector_of_attr(c, 0, "numel"); });

template <typename Device, typename T>
class SparseUnpackOp : public OpKernel {
 public:
  explicit SparseUnpackOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("numel", &numel_));
    OP_REQUIRES_OK(c, c->GetAttr("divisor", &divisor_));
    OP_REQUIRES_OK(c, check_indexable(numel_));
  }
  void Compute(OpKernelContext* c) override {
    const Tensor& values = c->input(0);
    const Tensor& index = c->input(1);
    const Tensor& scale = c->input(2);
    const Device dev(c);
    OP_REQUIRES_OK(c, check_pair(values, index, "values", "index"));
    OP_REQUIRES(c, scale.NumElements() == 1, invalid("scale should have 1 element, got ", scale.NumElements()));
    OP_REQUIRES_OK(c, dev.check_index(index, numel_, "index"));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({numel_}), &dense));
    OP_REQUIRES_OK(
        c, dev.template sparse_unpack<T>(values, index, UnpackScale(scale.flat<float>().data(), divisor_), dense));
  }

 private:
  int64_t numel_;
  int64_t divisor_;
};
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommSparseUnpack").Device(DEVICE_CPU), "T", SparseUnpackOp, CpuDevice);

// ---- SparsecommCheckedScale ----
// Horovod's reduced placeholder, sparsecomm/core/placement.py's marker c * [M ranks, the ranks
// that came first, the sum of their firsts], checked to come from exactly `ranks` ranks whose
// first is `first` (placement.agrees' rule: tests/ops/test_tf_select_ops.py runs both on the
// same reductions); its first element, the op's scale c * M. Fails with `refusal` otherwise.
REGISTER_OP("SparsecommCheckedScale")
    .Attr("ranks: int >= 1")
    .Attr("first: int >= 0")
    .Attr("refusal: string")
    .Input("reduced: float")
    .Output("scale: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(1));
      return absl::OkStatus();
    });

class CheckedScaleOp : public OpKernel {
 public:
  explicit CheckedScaleOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("ranks", &ranks_));
    OP_REQUIRES_OK(c, c->GetAttr("first", &first_));
    OP_REQUIRES_OK(c, c->GetAttr("refusal", &refusal_));
  }
  void Compute(OpKernelContext* c) override {
    const Tensor& reduced = c->input(0);
    OP_REQUIRES(c, reduced.NumElements() == 3, invalid("reduced should have 3 elements, got ", reduced.NumElements()));
    const auto r = reduced.flat<float>();
    const double scale = r(0), firsts = r(1), first_ranks = r(2);
    // The sums are integers times c, which is `firsts` when exactly one rank came first.
    const bool agrees = std::abs(scale - static_cast<double>(ranks_) * firsts) < 0.5 * firsts &&
                        std::abs(first_ranks - scale * static_cast<double>(first_)) < 0.5 * firsts;
    OP_REQUIRES(c, agrees, invalid(refusal_, "; reduced marker [", scale, ", ", firsts, ", ", first_ranks, "]"));
    c->set_output(0, reduced.Slice(0, 1));
  }

 private:
  int64_t ranks_, first_;
  std::string refusal_;
};
REGISTER_KERNEL_BUILDER(Name("SparsecommCheckedScale").Device(DEVICE_CPU), CheckedScaleOp);

// ---- SparsecommWireRows, SparsecommWireColumns ----
// The wire rows of sparsecomm/core/wire.py (kernels/wire.h) built and read by one op each, the
// torch ops' launchers: as a few dozen graph ops a tensor, they dominated the exchange's tracing.
namespace {

// The range lies where int32 indices reach: checked when the op is traced and when it runs.
absl::Status check_wire_range(int64_t start, int64_t length) {
  constexpr int64_t kEnd = int64_t(1) << 31;
  if (start <= kEnd && length <= kEnd - start) return absl::OkStatus();  // (start + length could overflow)
  return invalid("wire_rows: [start, start + length) should lie in [0, 2^31), got start ", start, ", length ", length);
}

}  // namespace

// WireRows: the send of [start, start + length) of a tensor (index strictly ascending inside it).
REGISTER_OP("SparsecommWireRows")
    .Attr("T: {float, half, bfloat16}")
    .Attr("start: int >= 0")
    .Attr("length: int >= 0")
    .Input("values: T")
    .Input("index: int32")
    .Output("rows: uint8")
    .SetShapeFn([](InferenceContext* c) {
      DataType dtype;
      int64_t start, length;
      TF_RETURN_IF_ERROR(c->GetAttr("T", &dtype));
      TF_RETURN_IF_ERROR(c->GetAttr("start", &start));
      TF_RETURN_IF_ERROR(c->GetAttr("length", &length));
      TF_RETURN_IF_ERROR(check_wire_range(start, length));
      shape_inference::ShapeHandle values, index;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &index));
      shape_inference::DimensionHandle k, rows;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(values, 0), c->Dim(index, 0), &k));
      TF_RETURN_IF_ERROR(c->Add(k, wire_buckets(start, length), &rows));  // unknown where k is
      c->set_output(0, c->Matrix(rows, kWireOffsetBytes + DataTypeSize(dtype)));
      return absl::OkStatus();
    });

template <typename Device, typename T>
class WireRowsOp : public OpKernel {
 public:
  explicit WireRowsOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("start", &start_));
    OP_REQUIRES_OK(c, c->GetAttr("length", &length_));
    OP_REQUIRES_OK(c, check_wire_range(start_, length_));
  }
  void Compute(OpKernelContext* c) override {
    const Tensor& values = c->input(0);
    const Tensor& index = c->input(1);
    OP_REQUIRES_OK(c, check_pair(values, index, "values", "index"));
    const int64_t k = index.NumElements();
    OP_REQUIRES(c, k <= length_, invalid("wire_rows: ", k, " elements do not fit a range of ", length_));
    Tensor* rows = nullptr;
    const TensorShape shape({k + wire_buckets(start_, length_), kWireOffsetBytes + int64_t(sizeof(T))});
    OP_REQUIRES_OK(c, c->allocate_output(0, shape, &rows));
    OP_REQUIRES_OK(c, Device(c).wire_rows(values, index, start_, length_, rows));
  }

 private:
  int64_t start_;
  int64_t length_;
};
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommWireRows").Device(DEVICE_CPU), "T", WireRowsOp, CpuDevice);

// WireColumns: the elements of rows whose values are T (any sends one after another, as a
// gather brings them), in order: an element's index is its offset in the last marker's bucket.
REGISTER_OP("SparsecommWireColumns")
    .Attr("T: {float, half, bfloat16}")
    .Input("rows: uint8")
    .Output("values: T")
    .Output("index: int32")
    .SetShapeFn([](InferenceContext* c) {
      DataType dtype;
      TF_RETURN_IF_ERROR(c->GetAttr("T", &dtype));
      shape_inference::ShapeHandle rows;
      shape_inference::DimensionHandle width;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(rows, 1), kWireOffsetBytes + DataTypeSize(dtype), &width));
      return unknown_vectors(c, 0, 2);
    });

template <typename Device, typename T>
class WireColumnsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* c) override {
    const Tensor& rows = c->input(0);
    const int64_t width = kWireOffsetBytes + int64_t(sizeof(T));
    OP_REQUIRES(c, rows.dims() == 2 && rows.dim_size(1) == width,
                invalid("wire_columns: rows should be 2-D of ", width, " columns (a uint16 offset, then a ",
                        DataTypeString(DataTypeToEnum<T>::v()), " value), got shape ", rows.shape().DebugString()));
    OP_REQUIRES_OK(c, Device(c).template wire_columns<T>(rows));
  }
};
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommWireColumns").Device(DEVICE_CPU), "T", WireColumnsOp, CpuDevice);

// ---- SparsecommRandomKIndices ----
REGISTER_OP("SparsecommRandomKIndices")
    .Input("seed: int64")
    .Input("tensor_id: int64")
    .Input("step: int64")
    .Input("numel: int64")
    .Input("k: int64")
    .Output("index: int32")
    .SetShapeFn([](InferenceContext* c) { return unknown_vectors(c, 0, 1); });

template <typename Device>
class RandomKIndicesOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* c) override {
    int64_t seed, tensor_id, step, numel, k;
    OP_REQUIRES_OK(
        c, scalar_inputs(c, 0, {"seed", "tensor_id", "step", "numel", "k"}, {&seed, &tensor_id, &step, &numel, &k}));
    OP_REQUIRES_OK(c, check_indexable(numel));
    OP_REQUIRES(c, k >= 0 && k <= numel, invalid("k should be in [0, numel=", numel, "], got ", k));
    OP_REQUIRES_OK(c, check_stream(tensor_id, step));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({k}), &out));
    OP_REQUIRES_OK(
        c, Device(c).random_k_indices(Permutation(uint64_t(seed), uint32_t(tensor_id), uint64_t(step), numel), k, out));
  }
};
REGISTER_KERNEL_BUILDER(Name("SparsecommRandomKIndices").Device(DEVICE_CPU), RandomKIndicesOp<CpuDevice>);

#if GOOGLE_CUDA
// ---- GPU kernels: the same bodies over GpuDevice (gpu.h); scalars read on the host are
// HostMemory. The threshold stays on the device: sample_threshold writes it there and
// accumulate_candidates reads it there.
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommSampleThreshold")
                              .Device(DEVICE_GPU)
                              .HostMemory("seed")
                              .HostMemory("tensor_id")
                              .HostMemory("step")
                              .HostMemory("ratio"),
                          "T", SampleThresholdOp, GpuDevice);
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommAccumulateCandidates").Device(DEVICE_GPU), "T", AccumulateCandidatesOp,
                          GpuDevice);
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommAccumulate").Device(DEVICE_GPU), "T", AccumulateOp, GpuDevice);
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommMomentumStep").Device(DEVICE_GPU), "T", MomentumStepOp, GpuDevice);
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommSumOfSquares").Device(DEVICE_GPU), "T", SumOfSquaresOp, GpuDevice);
REGISTER_KERNEL_BUILDER(Name("SparsecommSelectTop").Device(DEVICE_GPU).HostMemory("k"), SelectTopOp<GpuDevice>);
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommSelectBand").Device(DEVICE_GPU), "T", SelectBandOp, GpuDevice);
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommSendSelected").Device(DEVICE_GPU), "dtype", SendSelectedOp, GpuDevice);
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommSparseUnpack").Device(DEVICE_GPU), "T", SparseUnpackOp, GpuDevice);
// The check reads Horovod's 3 reduced floats on the host: TF copies them there once Horovod's
// (asynchronous) allreduce is done, and the scale back.
REGISTER_KERNEL_BUILDER(Name("SparsecommCheckedScale").Device(DEVICE_GPU).HostMemory("reduced").HostMemory("scale"),
                        CheckedScaleOp);
// The wire rows' GPU kernels are the CPU pass on host memory (TF's own Pack does this for
// int32): csrc/cuda has no launcher for them (torch's CUDA binding uses torch's scatters), and
// WireColumns' output count would need a host synchronisation anyway. A GPU graph copies the
// selection's pairs and rows between host and device: bytes of the selection, not the tensor.
SC_REGISTER_FLOAT_KERNELS(
    Name("SparsecommWireRows").Device(DEVICE_GPU).HostMemory("values").HostMemory("index").HostMemory("rows"), "T",
    WireRowsOp, CpuDevice);
SC_REGISTER_FLOAT_KERNELS(
    Name("SparsecommWireColumns").Device(DEVICE_GPU).HostMemory("rows").HostMemory("values").HostMemory("index"), "T",
    WireColumnsOp, CpuDevice);
REGISTER_KERNEL_BUILDER(Name("SparsecommRandomKIndices")
                            .Device(DEVICE_GPU)
                            .HostMemory("seed")
                            .HostMemory("tensor_id")
                            .HostMemory("step")
                            .HostMemory("numel")
                            .HostMemory("k"),
                        RandomKIndicesOp<GpuDevice>);
#endif  // GOOGLE_CUDA

}  // namespace tf_binding
}  // namespace sparsecomm
