// The quantize family's TF ops (csrc/kernels/quantize.h) over csrc/cpu/quantize.cpp and
// csrc/cuda/select.cu: the same launchers as the torch ops. Functional like select.cc:
// residual and momentum come in and go out (0 elements: absent).
#include "common.h"
#include "cpu.h"
#if GOOGLE_CUDA
#include "gpu.h"
#endif

namespace sparsecomm {
namespace tf_binding {
namespace {

absl::Status get_bits(OpKernelConstruction* c, int* bits) {
  TF_RETURN_IF_ERROR(c->GetAttr("bits", bits));
  return *bits == 1 || *bits == 2 ? absl::OkStatus() : invalid("bits should be 1 or 2, got ", *bits);
}

}  // namespace

// ---- SparsecommSendQuantized ----
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
      TF_RETURN_IF_ERROR(unknown_vectors(c, 0, 2));
      return same_as_input(c, 2, 2, 2);
    });

template <typename Device>
class SendQuantizedOp : public OpKernel {
 public:
  explicit SendQuantizedOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, get_bits(c, &bits_));
    OP_REQUIRES_OK(c, c->GetAttr("masking", &masking_));
  }
  void Compute(OpKernelContext* c) override {
    const Device dev(c);
    Feedback fb;
    OP_REQUIRES_OK(c, send_inputs(c, dev, 2, masking_, &fb));
    const Tensor& acc = c->input(0);
    const Tensor& index = c->input(1);
    Tensor *codes = nullptr, *scales = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({quantized_bytes(acc.NumElements(), bits_)}), &codes));
    OP_REQUIRES_OK(c, c->allocate_output(1, TensorShape({quantized_scales(bits_)}), &scales));
    OP_REQUIRES_OK(c, dev.send_quantized(acc.flat<float>().data(), index.flat<int32_t>().data(), acc.NumElements(), fb,
                                         bits_, codes->flat<uint8_t>().data(), scales->flat<float>().data()));
  }

 private:
  int bits_;
  bool masking_;
};
REGISTER_KERNEL_BUILDER(Name("SparsecommSendQuantized").Device(DEVICE_CPU), SendQuantizedOp<CpuDevice>);

// ---- SparsecommDequantize ----
REGISTER_OP("SparsecommDequantize")
    .Attr("bits: int")
    .Input("codes: uint8")
    .Input("scales: float")
    .Input("count: int64")
    .Output("values: float")
    .SetShapeFn([](InferenceContext* c) { return unknown_vectors(c, 0, 1); });

template <typename Device>
class DequantizeOp : public OpKernel {
 public:
  explicit DequantizeOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, get_bits(c, &bits_)); }
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
    OP_REQUIRES_OK(c, Device(c).dequantize(codes.flat<uint8_t>().data(), scales.flat<float>().data(), count, bits_,
                                           values->flat<float>().data()));
  }

 private:
  int bits_;
};
REGISTER_KERNEL_BUILDER(Name("SparsecommDequantize").Device(DEVICE_CPU), DequantizeOp<CpuDevice>);

#if GOOGLE_CUDA
// ---- GPU kernels: the same bodies over GpuDevice (gpu.h); count is read on the host.
REGISTER_KERNEL_BUILDER(Name("SparsecommSendQuantized").Device(DEVICE_GPU), SendQuantizedOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SparsecommDequantize").Device(DEVICE_GPU).HostMemory("count"), DequantizeOp<GpuDevice>);
#endif  // GOOGLE_CUDA

}  // namespace tf_binding
}  // namespace sparsecomm
