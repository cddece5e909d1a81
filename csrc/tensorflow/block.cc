// The block family's TF ops (csrc/kernels/block.h, philox.h) over csrc/cpu/block.cpp and
// csrc/cuda/block.cu: the same launchers as the torch ops, so both frameworks compute
// identical bits from identical inputs. TF ops are functional: the residual comes in and the
// updated residual goes out (the Python layer assigns it).
#include "../kernels/philox.h"
#include "common.h"
#include "cpu.h"
#if GOOGLE_CUDA
#include "gpu.h"
#endif

namespace sparsecomm {
namespace tf_binding {

namespace {

absl::Status check_block(int64_t numel, int64_t start, int64_t length) {
  if (length < 0 || length > numel) return invalid("length should be in [0, numel=", numel, "], got ", length);
  if (numel == 0 ? start != 0 : (start < 0 || start >= numel))
    return invalid("start should be in [0, numel=", numel, "), got ", start);
  return absl::OkStatus();
}

}  // namespace

// ---- SparsecommRandomBlockStart ----
REGISTER_OP("SparsecommRandomBlockStart")
    .Input("seed: int64")
    .Input("tensor_id: int64")
    .Input("step: int64")
    .Input("numel: int64")
    .Output("start: int64")
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc("Start of the cyclic random block (Philox4x32-10 selection stream of (seed, tensor_id, step)).");

class RandomBlockStartOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* c) override {
    int64_t seed, tensor_id, step, numel;
    OP_REQUIRES_OK(c, scalar_inputs(c, 0, {"seed", "tensor_id", "step", "numel"}, {&seed, &tensor_id, &step, &numel}));
    OP_REQUIRES_OK(c, check_stream(tensor_id, step));
    OP_REQUIRES(c, numel >= 0, invalid("numel should be >= 0, got ", numel));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = random_block_start(uint64_t(seed), uint32_t(tensor_id), uint64_t(step), numel);
  }
};
REGISTER_KERNEL_BUILDER(Name("SparsecommRandomBlockStart").Device(DEVICE_CPU), RandomBlockStartOp);

// ---- SparsecommBlockPack ----
REGISTER_OP("SparsecommBlockPack")
    .Attr("T: {float, half, bfloat16}")
    .Attr("length: int >= 0")
    .Input("grad: T")
    .Input("residual: float")
    .Input("start: int64")
    .Output("values: T")
    .Output("residual_out: float")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(vector_of_attr(c, 0, "length"));
      return same_as_input(c, 1, 1, 1);
    })
    .Doc("Error-feedback pack of a cyclic block (csrc/kernels/block.h). residual of 0 elements: no error feedback.");

template <typename Device, typename T>
class BlockPackOp : public OpKernel {
 public:
  explicit BlockPackOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, c->GetAttr("length", &length_)); }
  void Compute(OpKernelContext* c) override {
    const Tensor& grad = c->input(0);
    const Tensor& residual = c->input(1);
    int64_t start;
    OP_REQUIRES_OK(c, scalar_input(c, 2, "start", &start));
    const int64_t numel = grad.NumElements();
    OP_REQUIRES_OK(c, check_block(numel, start, length_));
    const bool feedback = residual.NumElements() == numel;
    OP_REQUIRES(c, feedback || residual.NumElements() == 0,
                invalid("residual should have ", numel, " elements like grad (or 0 for no error feedback), got ",
                        residual.NumElements()));
    Tensor* values = nullptr;
    Tensor* residual_out = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({length_}), &values));
    OP_REQUIRES_OK(c, c->allocate_output(1, residual.shape(), &residual_out));
    OP_REQUIRES_OK(c, Device(c).block_pack(raw<T>(grad), feedback ? residual.flat<float>().data() : nullptr,
                                           feedback ? residual_out->flat<float>().data() : nullptr, raw<T>(values),
                                           numel, start, length_));
  }

 private:
  int64_t length_;
};
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommBlockPack").Device(DEVICE_CPU), "T", BlockPackOp, CpuDevice);

// ---- SparsecommBlockUnpack ----
REGISTER_OP("SparsecommBlockUnpack")
    .Attr("T: {float, half, bfloat16}")
    .Attr("numel: int >= 0")
    .Attr("scale: float = 1.0")
    .Input("values: T")
    .Input("start: int64")
    .Output("dense: T")
    .SetShapeFn([](InferenceContext* c) { return vector_of_attr(c, 0, "numel"); })
    .Doc("Dense vector of numel elements: scale * values in the cyclic block, zero elsewhere.");

template <typename Device, typename T>
class BlockUnpackOp : public OpKernel {
 public:
  explicit BlockUnpackOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("numel", &numel_));
    OP_REQUIRES_OK(c, c->GetAttr("scale", &scale_));
  }
  void Compute(OpKernelContext* c) override {
    const Tensor& values = c->input(0);
    OP_REQUIRES(c, values.dims() == 1, invalid("values should be 1-D, got ", values.dims(), "-D"));
    int64_t start;
    OP_REQUIRES_OK(c, scalar_input(c, 1, "start", &start));
    OP_REQUIRES_OK(c, check_block(numel_, start, values.NumElements()));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({numel_}), &dense));
    OP_REQUIRES_OK(c,
                   Device(c).block_unpack(raw<T>(values), raw<T>(dense), numel_, start, values.NumElements(), scale_));
  }

 private:
  int64_t numel_;
  float scale_;
};
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommBlockUnpack").Device(DEVICE_CPU), "T", BlockUnpackOp, CpuDevice);

#if GOOGLE_CUDA
// ---- GPU kernels: the same bodies over GpuDevice (gpu.h); scalars read on the host are
// HostMemory. SparsecommRandomBlockStart is a host computation: all of it in host memory.
REGISTER_KERNEL_BUILDER(Name("SparsecommRandomBlockStart")
                            .Device(DEVICE_GPU)
                            .HostMemory("seed")
                            .HostMemory("tensor_id")
                            .HostMemory("step")
                            .HostMemory("numel")
                            .HostMemory("start"),
                        RandomBlockStartOp);
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommBlockPack").Device(DEVICE_GPU).HostMemory("start"), "T", BlockPackOp,
                          GpuDevice);
SC_REGISTER_FLOAT_KERNELS(Name("SparsecommBlockUnpack").Device(DEVICE_GPU).HostMemory("start"), "T", BlockUnpackOp,
                          GpuDevice);
#endif  // GOOGLE_CUDA

}  // namespace tf_binding
}  // namespace sparsecomm
