// The quantize family's torch ops (csrc/kernels/quantize.h; launchers in csrc/cpu/quantize.cpp,
// csrc/cuda/select.cu), each body written once over a device policy (common.h).
#pragma once
#include <vector>

#include "common.h"
#include "select.h"

namespace sparsecomm {
namespace torch_binding {

template <typename Device>
std::tuple<at::Tensor, at::Tensor> send_quantized(const at::Tensor& acc_in, const at::Tensor& index_in,
                                                  const c10::optional<at::Tensor>& residual,
                                                  const c10::optional<at::Tensor>& momentum, bool masking,
                                                  int64_t bits) {
  const typename Device::Guard guard(acc_in.device());
  check_candidates("send_quantized", acc_in, index_in);
  check_bits("send_quantized", bits);
  const at::Tensor acc = acc_in.contiguous(), index = index_in.contiguous();
  const Feedback fb = send_feedback<Device>("send_quantized", index, residual, momentum, masking);
  at::Tensor codes = at::empty({quantized_bytes(acc.numel(), int(bits))}, acc.options().dtype(at::kByte));
  at::Tensor scales = at::empty({quantized_scales(int(bits))}, acc.options());
  Device::send_quantized(acc.data_ptr<float>(), index.data_ptr<int32_t>(), acc.numel(), fb, int(bits),
                         codes.data_ptr<uint8_t>(), scales.data_ptr<float>());
  return {codes, scales};
}

template <typename Device>
at::Tensor dequantize(const at::Tensor& codes_in, const at::Tensor& scales_in, int64_t count, int64_t bits) {
  const typename Device::Guard guard(codes_in.device());
  check_quantized("dequantize", codes_in, scales_in, count, bits);
  const at::Tensor codes = codes_in.contiguous(), scales = scales_in.contiguous();
  at::Tensor values = at::empty({count}, scales.options());
  Device::dequantize(codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), count, int(bits), values.data_ptr<float>());
  return values;
}

// One rank's 1-/2-bit segment of sparsecomm/core/wire.py (whose Segment TF's graph ops build
// from): count int64, the scales float32, each bucket's count (uint16), each index's offset in its
// bucket (uint16), the codes, then zeros to a multiple of 8 bytes (the next rank's count stays
// aligned). Byte offsets from the segment's start.
struct QuantizedSegment {
  static constexpr int64_t kCountBytes = 8;
  int64_t count, buckets, scales_at, counts_at, offsets_at, codes_at, codes_end, size;
  QuantizedSegment(int64_t count, int bits, int64_t buckets)
      : count(count),
        buckets(buckets),
        scales_at(kCountBytes),
        counts_at(kCountBytes + int64_t(sizeof(float)) * quantized_scales(bits)),
        offsets_at(counts_at + kWireOffsetBytes * buckets),
        codes_at(offsets_at + kWireOffsetBytes * count),
        codes_end(codes_at + quantized_bytes(count, bits)),
        size((codes_end + kCountBytes - 1) / kCountBytes * kCountBytes) {}
};

// This rank's segment of a tensor of `numel` elements, built by one op (it took 5 Python-level
// torch calls, about 25 us a tensor on a CPU).
template <typename Device>
at::Tensor quantized_segment(const at::Tensor& codes_in, const at::Tensor& scales_in, const at::Tensor& index_in,
                             int64_t bits, int64_t numel) {
  const typename Device::Guard guard(index_in.device());
  TORCH_CHECK(index_in.scalar_type() == at::kInt && index_in.dim() == 1,
              "quantized_segment: index should be a 1-D int32 tensor, got ", index_in.dim(), "-D ",
              index_in.scalar_type());
  check_quantized("quantized_segment", codes_in, scales_in, index_in.numel(), bits);
  TORCH_CHECK(codes_in.device() == index_in.device() && scales_in.device() == index_in.device(),
              "quantized_segment: codes, scales and index should be on one device");
  TORCH_CHECK(numel >= index_in.numel() && numel < (int64_t(1) << 31), "quantized_segment: numel should be in [",
              index_in.numel(), ", 2^31), got ", numel);
  const at::Tensor codes = codes_in.contiguous(), scales = scales_in.contiguous(), index = index_in.contiguous();
  const QuantizedSegment s(index.numel(), int(bits), wire_buckets(0, numel));
  at::Tensor segment = at::empty({s.size}, codes.options());
  Device::write_count(segment, s.count);
  Device::copy_bytes(scales, segment.narrow(0, s.scales_at, scales.nbytes()));
  Device::segment_offsets(index, segment.narrow(0, s.counts_at, s.offsets_at - s.counts_at),
                          segment.narrow(0, s.offsets_at, s.codes_at - s.offsets_at));
  Device::copy_bytes(codes, segment.narrow(0, s.codes_at, codes.nbytes()));
  Device::zero_bytes(segment.narrow(0, s.codes_end, s.size - s.codes_end));
  return segment;
}

// sparse_unpack_into of every rank's segment, gathered in rank order: the codes decoded with
// their rank's scales, cast to out's dtype. The segments' lengths differ, so each count is read
// where it lies (on CUDA: a read back per rank, as the walk needs it).
template <typename Device>
void sparse_unpack_segments_into(const at::Tensor& gathered_in, int64_t bits, int64_t ranks, const at::Tensor& scale,
                                 int64_t divisor, const at::Tensor& out) {
  const typename Device::Guard guard(out.device());
  check_bits("sparse_unpack_segments", bits);
  const UnpackScale factor = unpack_scale("sparse_unpack_segments", scale, divisor, out);
  TORCH_CHECK(ranks >= 1, "sparse_unpack_segments: ranks should be >= 1, got ", ranks);
  TORCH_CHECK(gathered_in.scalar_type() == at::kByte && gathered_in.dim() == 1,
              "sparse_unpack_segments: gathered should be a 1-D uint8 tensor, got ", gathered_in.dim(), "-D ",
              gathered_in.scalar_type());
  const at::Tensor gathered = gathered_in.contiguous();
  std::vector<QuantizedSegment> segments;
  std::vector<int64_t> starts;
  int64_t start = 0, total = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    TORCH_CHECK(start + QuantizedSegment::kCountBytes <= gathered.numel(), "sparse_unpack_segments: gathered (",
                gathered.numel(), " bytes) should hold ", ranks, " segments, got ", r);
    const int64_t count = Device::read_count(gathered, start);
    TORCH_CHECK(count >= 0 && count <= (gathered.numel() - start) / kWireOffsetBytes,
                "sparse_unpack_segments: segment ", r, " at byte ", start, " has a count of ", count,
                ", which does not fit in gathered (", gathered.numel(), " bytes)");
    segments.emplace_back(count, int(bits), wire_buckets(0, out.numel()));
    starts.push_back(start);
    start += segments.back().size;
    total += count;
  }
  TORCH_CHECK(start == gathered.numel(), "sparse_unpack_segments: ", ranks, " segments of a tensor of ", out.numel(),
              " elements should fill gathered (", gathered.numel(), " bytes), got ", start, " bytes");
  at::Tensor values = at::empty({total}, gathered.options().dtype(at::kFloat));
  at::Tensor index = at::empty({total}, gathered.options().dtype(at::kInt));
  const uint8_t* base = gathered.data_ptr<uint8_t>();
  int64_t filled = 0;
  for (size_t r = 0; r < segments.size(); ++r) {
    const QuantizedSegment& s = segments[r];
    const uint8_t* segment = base + starts[r];
    Device::dequantize(segment + s.codes_at, reinterpret_cast<const float*>(segment + s.scales_at), s.count, int(bits),
                       values.data_ptr<float>() + filled);
    Device::segment_index(gathered.narrow(0, starts[r] + s.counts_at, s.offsets_at - s.counts_at),
                          gathered.narrow(0, starts[r] + s.offsets_at, s.codes_at - s.offsets_at),
                          index.narrow(0, filled, s.count));
    filled += s.count;
  }
  unpack_into<Device>(values.to(out.scalar_type()), index, factor, out);
}

template <typename Device>
void register_quantize_ops(torch::Library& m) {
  m.impl("send_quantized", &send_quantized<Device>);
  m.impl("dequantize", &dequantize<Device>);
  m.impl("quantized_segment", &quantized_segment<Device>);
  m.impl("sparse_unpack_segments_into", &sparse_unpack_segments_into<Device>);
}

}  // namespace torch_binding
}  // namespace sparsecomm
