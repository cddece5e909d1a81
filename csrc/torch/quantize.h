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
  Device::write_count(segment, s.room);
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
    Device::dequantize(segment + s.codes_at, reinterpret_cast<const float*>(segment + s.scales_at), s.room, int(bits),
                       values.data_ptr<float>() + filled);
    Device::segment_index(gathered.narrow(0, starts[r] + s.counts_at, s.offsets_at - s.counts_at),
                          gathered.narrow(0, starts[r] + s.offsets_at, s.codes_at - s.offsets_at),
                          index.narrow(0, filled, s.room));
    filled += s.room;
  }
  unpack_into<Device>(values.to(out.scalar_type()), index, factor, out);
}

// The quantized sampled packs of a bucket at fixed capacity (DDP's and FSDP's): pack_sampled_fixed's
// selections, each sent by send_quantized (the bits of pack_sampled with bits, tensor by tensor):
// (codes, scales, index, counts), tensor p's codes and index of the room of its capacity_of, its
// first counts[p] (int64, on the gradients' device) sent. On CUDA the host reads nothing.
template <typename Device>
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>, at::Tensor> pack_quantized_fixed(
    at::TensorList grads, const c10::List<c10::optional<at::Tensor>>& residuals,
    const c10::List<c10::optional<at::Tensor>>& momenta, double momentum_factor,
    const c10::List<c10::optional<at::Tensor>>& grad_scales, bool nesterov, bool masking, at::ArrayRef<double> ratios,
    at::IntArrayRef plans, int64_t seed, int64_t bits) {
  constexpr const char* op = "pack_quantized_fixed";
  check_bits(op, bits);
  check_sampled_lengths(op, grads.size(), residuals, momenta, grad_scales, ratios, plans);
  if (grads.empty()) return {{}, {}, {}, at::empty({0}, at::kLong)};
  const typename Device::Guard guard(grads[0].device());
  PackedFixed fixed = Device::pack_fixed(sampled_tensors(op, grads, residuals, momenta, momentum_factor, grad_scales,
                                                         nesterov, ratios, plans, seed, c10::nullopt),
                                         masking, int(bits));
  return {std::move(fixed.values), std::move(fixed.scales), std::move(fixed.indices),
          fixed.counts.to(grads[0].device())};
}

// Send p of quantized_segments_fixed_into, checked: its codes, scales and index (its room: index's
// length), its count, and where its segment (laid out for the room) and its count's copy go in out.
inline FixedSegmentSend fixed_segment_send(const char* op, size_t p, const at::Tensor& codes, const at::Tensor& scales,
                                           const at::Tensor& index, int64_t bits, at::IntArrayRef places,
                                           const at::Tensor& out) {
  TORCH_CHECK(index.scalar_type() == at::kInt && index.dim() == 1, op, ": index should be 1-D int32 tensors, got ",
              index.dim(), "-D ", index.scalar_type(), " for send ", p);
  const int64_t room = index.numel(), slot = places[3 * p], offset = places[3 * p + 1], numel = places[3 * p + 2];
  check_quantized(op, codes, scales, room, bits);
  TORCH_CHECK(codes.is_contiguous() && scales.is_contiguous() && index.is_contiguous(), op,
              ": codes, scales and index should be contiguous; send ", p, "'s are not");
  TORCH_CHECK(codes.device() == out.device() && scales.device() == out.device() && index.device() == out.device(), op,
              ": codes, scales and index should be on out's device (", out.device(), "); send ", p, "'s are not");
  TORCH_CHECK(numel >= room && numel < (int64_t(1) << 31), op, ": send ", p, "'s numel should be in [its room ", room,
              ", 2^31), got ", numel);
  const QuantizedSegment layout(room, int(bits), wire_buckets(0, numel));
  const int64_t align = QuantizedSegment::kCountBytes;
  TORCH_CHECK(slot >= 0 && slot % align == 0 && slot + align <= offset && offset % align == 0 &&
                  offset + layout.size <= out.numel(),
              op, ": send ", p, "'s count slot at ", slot, " and segment of ", layout.size, " bytes at ", offset,
              " (both 8-byte aligned) should fit out's ", out.numel(), " bytes in that order");
  FixedSegmentSend s;
  s.codes = codes.data_ptr<uint8_t>(), s.scales = scales.data_ptr<float>(), s.index = index.data_ptr<int32_t>();
  s.room = room, s.buckets = layout.buckets, s.bits = int(bits);
  s.segment = out.data_ptr<uint8_t>() + offset, s.header = out.data_ptr<uint8_t>() + slot;
  return s;
}

// The fixed segments of a bucket's quantized packs (pack_quantized_fixed's) written into its chunk,
// where they travel: send p's first counts[p] (int64 on out's device) sent, its segment laid out for
// its room whatever its count; places[3p..3p+2] = (the byte offset of its count's copy in the chunk's
// header, of its segment, its tensor's numel). Nothing is read on the host (on CUDA, one kernel).
template <typename Device>
void quantized_segments_fixed_into(at::TensorList codes, at::TensorList scales, at::TensorList index,
                                   const at::Tensor& counts, int64_t bits, at::IntArrayRef places,
                                   const at::Tensor& out) {
  constexpr const char* op = "quantized_segments_fixed_into";
  const size_t n = codes.size();
  check_bits(op, bits);
  TORCH_CHECK(scales.size() == n && index.size() == n && counts.numel() == int64_t(n) && places.size() == 3 * n, op,
              ": scales, index and counts should hold one entry and places three numbers (count slot, byte offset, ",
              "numel) per codes, got ", n, " codes, ", scales.size(), " scales, ", index.size(), " index, ",
              counts.numel(), " counts and ", places.size(), " places");
  check_fixed_chunk(op, counts, out);
  const typename Device::Guard guard(out.device());
  const at::Tensor all = counts.contiguous();
  std::vector<FixedSegmentSend> sends;
  int64_t items = 0;
  for (size_t p = 0; p < n; ++p) {
    sends.push_back(fixed_segment_send(op, p, codes[p], scales[p], index[p], bits, places, out));
    sends.back().count = all.data_ptr<int64_t>() + p, sends.back().at = items;
    items += fixed_segment_items(sends.back());
  }
  Device::write_fixed_segments(sends, items, out.device());
}

// Where out p's fixed segment lies in each rank's chunk, and its layout's room and buckets.
struct SegmentRegion {
  int64_t offset, room, buckets;
};

// sparse_unpack_segments_into of many tensors' fixed segments gathered from every rank in one
// collective (a DDP bucket's): each row of `gathered` is a rank's chunk, out p's segment at byte
// regions[2p], laid out for regions[2p + 1] entries (its room). Each rank's count is read from its
// segment where the op runs (on CUDA, on the device: the host reads nothing); the sums in rank
// order, scaled by scale / divisor, cast to the outs' dtype.
template <typename Device>
void sparse_unpack_gathered_segments_into(const at::Tensor& gathered, at::IntArrayRef regions, int64_t bits,
                                          const at::Tensor& scale, int64_t divisor, at::TensorList outs) {
  constexpr const char* op = "sparse_unpack_gathered_segments";
  check_bits(op, bits);
  if (outs.empty()) return;
  const UnpackScale factor = unpack_scale(op, scale, divisor, outs[0]);
  const typename Device::Guard guard(gathered.device());
  TORCH_CHECK(gathered.scalar_type() == at::kByte && gathered.dim() == 2, op,
              ": gathered should be a 2-D uint8 tensor (a rank's chunk per row), got ", gathered.dim(), "-D ",
              gathered.scalar_type());
  const int64_t params = int64_t(outs.size()), chunk = gathered.size(1), align = QuantizedSegment::kCountBytes;
  TORCH_CHECK(int64_t(regions.size()) == 2 * params, op, ": regions should hold 2 numbers (byte offset, room) for ",
              "each of the ", params, " outs, got ", regions.size());
  std::vector<SegmentRegion> where;
  for (int64_t p = 0; p < params; ++p) {
    const at::Tensor& out = outs[p];
    TORCH_CHECK(out.is_contiguous() && out.scalar_type() == outs[0].scalar_type() && out.device() == gathered.device(),
                op, ": outs should be contiguous, of one dtype and on gathered's device; out ", p, " is ",
                out.scalar_type(), " on ", out.device());
    const int64_t offset = regions[2 * p], room = regions[2 * p + 1];
    TORCH_CHECK(room >= 0 && room <= out.numel(), op, ": out ", p, "'s room should be in [0, ", out.numel(),
                "], its numel, got ", room);
    const QuantizedSegment layout(room, int(bits), wire_buckets(0, out.numel()));
    TORCH_CHECK(offset >= 0 && offset % align == 0 && offset + layout.size <= chunk, op, ": out ", p, "'s segment of ",
                layout.size, " bytes at ", offset, " (8-byte aligned) should lie inside a chunk of ", chunk, " bytes");
    where.push_back({offset, room, layout.buckets});
  }
  Device::unpack_gathered_segments(gathered.contiguous(), where, int(bits), factor, outs);
}

template <typename Device>
void register_quantize_ops(torch::Library& m) {
  m.impl("send_quantized", &send_quantized<Device>);
  m.impl("dequantize", &dequantize<Device>);
  m.impl("quantized_segment", &quantized_segment<Device>);
  m.impl("sparse_unpack_segments_into", &sparse_unpack_segments_into<Device>);
  m.impl("pack_quantized_fixed", &pack_quantized_fixed<Device>);
  m.impl("quantized_segments_fixed_into", &quantized_segments_fixed_into<Device>);
  m.impl("sparse_unpack_gathered_segments_into", &sparse_unpack_gathered_segments_into<Device>);
}

}  // namespace torch_binding
}  // namespace sparsecomm
