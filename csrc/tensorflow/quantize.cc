// The quantize family's TF ops (csrc/kernels/quantize.h) over csrc/cpu/quantize.cpp and
// csrc/cuda/select.cu: the same launchers as the torch ops. Functional like select.cc:
// residual and momentum come in and go out (0 elements: absent).
#include <cstring>
#include <vector>

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

// `count` values' codes and their scales, as send_quantized writes them.
absl::Status check_quantized(const char* op, const Tensor& codes, const Tensor& scales, int64_t count, int bits) {
  if (count < 0 || codes.NumElements() != quantized_bytes(count, bits))
    return invalid(op, ": codes should have ", quantized_bytes(count, bits), " bytes for ", count, " values of ", bits,
                   " bits, got ", codes.NumElements());
  if (scales.NumElements() != quantized_scales(bits))
    return invalid(op, ": scales should be ", quantized_scales(bits), " values, got ", scales.NumElements());
  return absl::OkStatus();
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
    OP_REQUIRES_OK(c, check_quantized("dequantize", codes, scales, count, bits_));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({count}), &values));
    OP_REQUIRES_OK(c, Device(c).dequantize(codes.flat<uint8_t>().data(), scales.flat<float>().data(), count, bits_,
                                           values->flat<float>().data()));
  }

 private:
  int bits_;
};
REGISTER_KERNEL_BUILDER(Name("SparsecommDequantize").Device(DEVICE_CPU), DequantizeOp<CpuDevice>);

// ---- SparsecommQuantizedSegment ----
// This rank's segment of the wire (sparsecomm/core/wire.py) of a tensor of `numel`: its count,
// scales, bucket counts, offsets and codes, zero-padded to 8 bytes. One op, as torch's: in graph
// ops it took about 15 a tensor.
REGISTER_OP("SparsecommQuantizedSegment")
    .Attr("bits: int")
    .Attr("numel: int >= 0")
    .Input("codes: uint8")
    .Input("scales: float")
    .Input("index: int32")
    .Output("segment: uint8")
    .SetShapeFn([](InferenceContext* c) { return unknown_vectors(c, 0, 1); });

class QuantizedSegmentOp : public OpKernel {
 public:
  explicit QuantizedSegmentOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, get_bits(c, &bits_));
    OP_REQUIRES_OK(c, c->GetAttr("numel", &numel_));
    OP_REQUIRES(c, numel_ < (int64_t(1) << 31), invalid("numel should be below 2^31, got ", numel_));
  }
  void Compute(OpKernelContext* c) override {
    const Tensor& codes = c->input(0);
    const Tensor& scales = c->input(1);
    const Tensor& index = c->input(2);
    const int64_t count = index.NumElements();
    OP_REQUIRES(c, count <= numel_, invalid("quantized_segment: ", count, " indices for ", numel_, " elements"));
    OP_REQUIRES_OK(c, check_quantized("quantized_segment", codes, scales, count, bits_));
    const QuantizedSegment s(count, bits_, wire_buckets(0, numel_));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({s.size}), &out));
    uint8_t* segment = out->flat<uint8_t>().data();
    std::fill(segment, segment + s.size, uint8_t(0));
    std::memcpy(segment, &count, QuantizedSegment::kCountBytes);
    std::memcpy(segment + s.scales_at, scales.flat<float>().data(), sizeof(float) * quantized_scales(bits_));
    OP_REQUIRES(c,
                cpu::segment_offsets(index.flat<int32_t>().data(), count, s.buckets, segment + s.counts_at,
                                     segment + s.offsets_at),
                invalid("quantized_segment: index should be strictly ascending in [0, ", numel_, ")"));
    std::memcpy(segment + s.codes_at, codes.flat<uint8_t>().data(), codes.NumElements());
  }

 private:
  int bits_;
  int64_t numel_;
};
REGISTER_KERNEL_BUILDER(Name("SparsecommQuantizedSegment").Device(DEVICE_CPU), QuantizedSegmentOp);

// ---- SparsecommSegmentColumns ----
// Every rank's segment, gathered in rank order, read back: the codes decoded with their rank's
// scales and the indices, rank after rank. One op whatever the number of ranks: in graph ops
// each rank's segment took about 15 (its count read in the graph to find the next).
REGISTER_OP("SparsecommSegmentColumns")
    .Attr("bits: int")
    .Attr("ranks: int >= 1")
    .Attr("numel: int >= 0")
    .Input("gathered: uint8")
    .Output("values: float")
    .Output("index: int32")
    .SetShapeFn([](InferenceContext* c) { return unknown_vectors(c, 0, 2); });

class SegmentColumnsOp : public OpKernel {
 public:
  explicit SegmentColumnsOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, get_bits(c, &bits_));
    OP_REQUIRES_OK(c, c->GetAttr("ranks", &ranks_));
    OP_REQUIRES_OK(c, c->GetAttr("numel", &numel_));
    buckets_ = wire_buckets(0, numel_);
  }
  void Compute(OpKernelContext* c) override {
    const Tensor& gathered = c->input(0);
    const uint8_t* base = gathered.flat<uint8_t>().data();
    const int64_t bytes = gathered.NumElements();
    std::vector<int64_t> starts;
    std::vector<QuantizedSegment> segments;
    int64_t start = 0, total = 0;
    for (int64_t r = 0; r < ranks_; ++r) {
      int64_t count = -1;
      if (start + QuantizedSegment::kCountBytes <= bytes) std::memcpy(&count, base + start, sizeof(count));
      OP_REQUIRES(c, count >= 0 && count <= numel_ && count <= bytes - start,
                  invalid("segment_columns: segment ", r, " of ", ranks_, " at byte ", start, " of ", bytes,
                          " has no count that fits (", count, ")"));
      starts.push_back(start);
      segments.emplace_back(count, bits_, buckets_);
      start += segments.back().size;
      total += count;
    }
    OP_REQUIRES(
        c, start == bytes,
        invalid("segment_columns: ", ranks_, " segments should fill gathered (", bytes, " bytes), got ", start));
    Tensor *values = nullptr, *index = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({total}), &values));
    OP_REQUIRES_OK(c, c->allocate_output(1, TensorShape({total}), &index));
    int64_t filled = 0;
    for (int64_t r = 0; r < ranks_; ++r) {
      const QuantizedSegment& s = segments[r];
      const uint8_t* segment = base + starts[r];
      float scales[4];  // quantized_scales(bits) of them, copied: the segment's bytes need not be aligned
      std::memcpy(scales, segment + s.scales_at, sizeof(float) * quantized_scales(bits_));
      cpu::dequantize(segment + s.codes_at, scales, s.room, bits_, values->flat<float>().data() + filled);
      OP_REQUIRES(c,
                  cpu::segment_index(segment + s.counts_at, s.buckets, segment + s.offsets_at, s.room,
                                     index->flat<int32_t>().data() + filled),
                  invalid("segment_columns: segment ", r, "'s bucket counts do not add up to its count ", s.room));
      filled += s.room;
    }
  }

 private:
  int bits_;
  int64_t ranks_, numel_, buckets_;
};
REGISTER_KERNEL_BUILDER(Name("SparsecommSegmentColumns").Device(DEVICE_CPU), SegmentColumnsOp);

#if GOOGLE_CUDA
// ---- GPU kernels: the same bodies over GpuDevice (gpu.h); count is read on the host.
REGISTER_KERNEL_BUILDER(Name("SparsecommSendQuantized").Device(DEVICE_GPU), SendQuantizedOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name("SparsecommDequantize").Device(DEVICE_GPU).HostMemory("count"), DequantizeOp<GpuDevice>);
// The segments' GPU kernels are the CPU pass on host memory, as the wire rows' (select.cc): bytes
// of the selection, and SegmentColumns' output count needs the segments' counts on the host.
REGISTER_KERNEL_BUILDER(Name("SparsecommQuantizedSegment")
                            .Device(DEVICE_GPU)
                            .HostMemory("codes")
                            .HostMemory("scales")
                            .HostMemory("index")
                            .HostMemory("segment"),
                        QuantizedSegmentOp);
REGISTER_KERNEL_BUILDER(
    Name("SparsecommSegmentColumns").Device(DEVICE_GPU).HostMemory("gathered").HostMemory("values").HostMemory("index"),
    SegmentColumnsOp);
#endif  // GOOGLE_CUDA

}  // namespace tf_binding
}  // namespace sparsecomm
