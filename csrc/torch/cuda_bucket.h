// The CUDA device policy's bucket phases (csrc/torch/common.h): a DDP bucket's sampled packs
// (select.h's pack_sampled_many, pack_sampled_fixed), wire rows (wire_rows_many_into,
// wire_rows_fixed_into), clipping factors and momentum steps, each in a fixed number of launches
// over tables of segments (csrc/cuda/segments.cu, wire.cu), whatever its number of tensors.
// CudaDevice (cuda.cpp) takes them by inheritance.
#pragma once
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "../cuda/launchers.h"
#include "select.h"

namespace sparsecomm {
namespace torch_binding {

inline cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream(); }

// The binding's copies of device data to the host (on a GPU each waits for the stream to drain),
// counted: the emulated device's tests say which paths make none (docs/kernels.md).
inline std::atomic<int64_t> host_reads{0};
inline at::Tensor read_back(const at::Tensor& t) {
  ++host_reads;
  return t.to(at::kCPU);
}

// A table of POD rows (csrc/cuda/launchers.h's segments) copied to the device without waiting
// (pinned memory; the copy is ordered before the kernels that read it on the stream).
template <typename Row>
at::Tensor upload(const std::vector<Row>& rows, const at::Device& device) {
  const int64_t bytes = int64_t(rows.size() * sizeof(Row));
  at::Tensor host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(device.is_cuda()));
  if (bytes > 0) std::memcpy(host.data_ptr(), rows.data(), size_t(bytes));
  return host.to(device, /*non_blocking=*/true);
}

inline cuda::FloatType float_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return cuda::FloatType::kFloat16;
    case at::kBFloat16:
      return cuda::FloatType::kBFloat16;
    default:
      TORCH_CHECK(dtype == at::kFloat, "expected a float32, float16 or bfloat16 tensor, got ", dtype);
      return cuda::FloatType::kFloat32;
  }
}

struct CudaBucketPhases {
  // A bucket (select.h's pack_sampled_many) in a fixed number of launches over a table of
  // segments (csrc/cuda/segments.cu), whatever its number of tensors. Bucket: the first phase's
  // table and results on the device; the totals are its one read.
  struct Bucket {
    at::Tensor table, thresholds, tile_counts, inclusive, totals;
    int64_t tiles = 0;
  };
  static Bucket count_bucket(const std::vector<SampledTensor>& tensors) { return counted(tensors, {}); }

  // The first phase over a table of segments; at fixed capacity, rooms[p] candidates of tensor p
  // at most are compacted, into a room of their own.
  static Bucket counted(const std::vector<SampledTensor>& tensors, const std::vector<int64_t>& rooms) {
    std::vector<cuda::Segment> segments;
    int64_t samples = 0, blocks = 0, tiles = 0, room_at = 0;
    for (const SampledTensor& t : tensors) {
      cuda::Segment s;
      if (!rooms.empty()) s.room_at = room_at, s.room = rooms[segments.size()], room_at += s.room;
      s.grad = t.args.grad.data_ptr();
      s.grad_type = float_type(t.args.grad.scalar_type());
      s.fb = t.args.fb;
      s.numel = t.args.grad.numel();
      s.plan = t.sample;
      s.fixed = t.fixed;
      s.sample_at = samples, s.block_at = blocks, s.tile_at = tiles;
      samples += s.plan.count, blocks += cuda::digit_blocks(s.plan.count), tiles += cuda::candidate_tiles(s.numel);
      segments.push_back(s);
    }
    const at::TensorOptions on = tensors[0].args.grad.options();
    const int64_t n = int64_t(segments.size());
    Bucket b{upload(segments, on.device()),          at::empty({n}, on.dtype(at::kFloat)),
             at::empty({tiles}, on.dtype(at::kInt)), at::Tensor(),
             at::empty({n}, on.dtype(at::kLong)),    tiles};
    const auto* table = static_cast<const cuda::Segment*>(b.table.data_ptr());
    at::Tensor sample = at::empty({samples}, on.dtype(at::kFloat));
    at::Tensor states = at::empty({n * int64_t(sizeof(cuda::SelectState))}, on.dtype(at::kByte));
    cuda::sample_segments(table, n, samples, blocks, sample.data_ptr<float>(),
                          static_cast<cuda::SelectState*>(states.data_ptr()), b.thresholds.data_ptr<float>(), stream());
    cuda::count_segments(table, n, tiles, b.thresholds.data_ptr<float>(), b.tile_counts.data_ptr<int32_t>(), stream());
    b.inclusive = b.tile_counts.cumsum(0, at::kLong);
    cuda::segment_totals(table, n, b.inclusive.data_ptr<int64_t>(), b.totals.data_ptr<int64_t>(), stream());
    return b;
  }
  static std::vector<int64_t> bucket_totals(const Bucket& b) {
    const at::Tensor host = read_back(b.totals);  // the one synchronisation: the candidates' sizes
    return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  }
  static std::vector<std::tuple<at::Tensor, at::Tensor>> bucket_candidates(const Bucket& b,
                                                                           const std::vector<SampledTensor>& tensors,
                                                                           const std::vector<int64_t>& counts) {
    int64_t total = 0;
    for (const int64_t count : counts) total += count;
    const at::TensorOptions on = tensors[0].args.grad.options();
    at::Tensor acc = at::empty({total}, on.dtype(at::kFloat)), index = at::empty({total}, on.dtype(at::kInt));
    cuda::compact_segments(static_cast<const cuda::Segment*>(b.table.data_ptr()), int64_t(tensors.size()), b.tiles,
                           b.thresholds.data_ptr<float>(), b.tile_counts.data_ptr<int32_t>(),
                           b.inclusive.data_ptr<int64_t>(), b.totals.data_ptr<int64_t>(), acc.data_ptr<float>(),
                           index.data_ptr<int32_t>(), stream());
    std::vector<std::tuple<at::Tensor, at::Tensor>> candidates;
    int64_t offset = 0;
    for (const int64_t count : counts) {
      candidates.emplace_back(acc.narrow(0, offset, count), index.narrow(0, offset, count));
      offset += count;
    }
    return candidates;
  }
  // Every list's top k in one kernel (segments.cu), a block a list.
  static std::vector<std::tuple<at::Tensor, at::Tensor>> select_top_many(const std::vector<TopOf>& lists) {
    if (lists.empty()) return {};
    std::vector<cuda::TopSegment> table;
    std::vector<at::Tensor> kept;  // (contiguous copies alive until the launch)
    int64_t total = 0;
    for (const TopOf& list : lists) total += std::min(list.acc.numel(), list.k);
    const at::TensorOptions on = lists[0].acc.options();
    at::Tensor acc = at::empty({total}, on), index = at::empty({total}, on.dtype(at::kInt));
    std::vector<std::tuple<at::Tensor, at::Tensor>> tops;
    int64_t offset = 0;
    for (const TopOf& list : lists) {
      cuda::TopSegment t;
      kept.push_back(list.acc.contiguous());
      kept.push_back(list.index.contiguous());
      t.acc = kept[kept.size() - 2].data_ptr<float>(), t.index = kept.back().data_ptr<int32_t>();
      t.count = list.acc.numel(), t.k = list.k;
      const int64_t size = std::min(t.count, t.k);
      tops.emplace_back(acc.narrow(0, offset, size), index.narrow(0, offset, size));
      t.acc_top = acc.data_ptr<float>() + offset, t.index_top = index.data_ptr<int32_t>() + offset;
      offset += size;
      table.push_back(t);
    }
    const at::Tensor rows = upload(table, acc.device());
    cuda::top_segments(static_cast<const cuda::TopSegment*>(rows.data_ptr()), int64_t(table.size()), stream());
    return tops;
  }
  static std::vector<at::Tensor> send_bucket(const std::vector<SampledTensor>& tensors,
                                             const std::vector<at::Tensor>& accs,
                                             const std::vector<at::Tensor>& indices, bool masking) {
    std::vector<cuda::SendSegment> sends;
    std::vector<at::Tensor> values, kept;  // (kept: contiguous copies alive until the launch)
    int64_t total = 0;
    for (size_t p = 0; p < tensors.size(); ++p) {
      const SampledTensor& t = tensors[p];
      kept.push_back(accs[p].contiguous());
      kept.push_back(indices[p].contiguous());
      values.push_back(at::empty({accs[p].numel()}, accs[p].options().dtype(t.value_dtype)));
      cuda::SendSegment s;
      s.acc = kept[2 * p].data_ptr<float>();
      s.index = kept[2 * p + 1].data_ptr<int32_t>();
      s.count = accs[p].numel(), s.at = total, total += s.count;
      s.fb = send_state("pack_sampled_many", t.residual, t.momentum, masking);
      s.values = values.back().data_ptr();
      s.value_type = float_type(t.value_dtype);
      sends.push_back(s);
    }
    const at::Tensor table = upload(sends, tensors[0].args.grad.device());
    cuda::send_segments(static_cast<const cuda::SendSegment*>(table.data_ptr()), int64_t(sends.size()), total,
                        stream());
    return values;
  }

  // A bucket's rows in one kernel, a thread per row over a table of its sends.
  static void wire_rows_many(const std::vector<WireSend>& sends, const at::Device& device) {
    if (sends.empty()) return;
    std::vector<cuda::WireSegment> table;
    int64_t total = 0;
    for (const WireSend& s : sends) {
      cuda::WireSegment w;
      w.values = s.values.data_ptr();
      w.index = s.index.data_ptr<int32_t>();
      w.value_bytes = s.values.element_size();
      w.count = s.index.numel(), w.buckets = wire_buckets(0, s.length);
      w.at = total, total += w.count + w.buckets;
      w.rows = s.rows;
      w.limit = s.count, w.rows_count = s.rows_count;  // (fixed capacity: the count read on the device)
      table.push_back(w);
    }
    const at::Tensor rows = upload(table, device);
    cuda::wire_segments(static_cast<const cuda::WireSegment*>(rows.data_ptr()), int64_t(table.size()), total, stream());
  }
};

// A bucket's sampled packs at fixed capacity (select.h's pack_sampled_fixed): the same first
// phase, then each tensor's band decided on the device, so that the host reads nothing.
struct CudaFixedBucket : CudaBucketPhases {
  // The bucket at fixed capacity, nothing read on the host: the first phase, each tensor's
  // candidates compacted into a room of twice its capacity (and a tile), its band and top k decided
  // on the device (fixed_tops), the sends up to the counts that decided (bits 1 or 2: quantized, a
  // block a tensor).
  static PackedFixed pack_fixed(const std::vector<SampledTensor>& tensors, bool masking, int bits = 0) {
    std::vector<int64_t> rooms;
    for (const SampledTensor& t : tensors)
      rooms.push_back(std::min(t.args.grad.numel(), 2 * capacity_of(t) + cuda::kCandidateTile));
    const Bucket b = counted(tensors, rooms);
    int64_t room_total = 0, total = 0;
    for (size_t p = 0; p < tensors.size(); ++p) room_total += rooms[p], total += capacity_of(tensors[p]);
    const at::TensorOptions on = tensors[0].args.grad.options();
    at::Tensor acc = at::empty({room_total}, on.dtype(at::kFloat)), index = at::empty({room_total}, on.dtype(at::kInt));
    const int64_t n = int64_t(tensors.size());
    cuda::compact_segments(static_cast<const cuda::Segment*>(b.table.data_ptr()), n, b.tiles,
                           b.thresholds.data_ptr<float>(), b.tile_counts.data_ptr<int32_t>(),
                           b.inclusive.data_ptr<int64_t>(), b.totals.data_ptr<int64_t>(), acc.data_ptr<float>(),
                           index.data_ptr<int32_t>(), stream());
    PackedFixed fixed;
    at::Tensor acc_top = at::empty({total}, on.dtype(at::kFloat)), index_top = at::empty({total}, on.dtype(at::kInt));
    fixed.counts = at::empty({n}, on.dtype(at::kLong));
    std::vector<cuda::FixedTop> tops;
    int64_t room_at = 0, at = 0;
    for (size_t p = 0; p < tensors.size(); ++p) {
      const int64_t capacity = capacity_of(tensors[p]);
      tops.push_back(
          fixed_top(tensors[p], acc.data_ptr<float>() + room_at, index.data_ptr<int32_t>() + room_at, rooms[p]));
      tops.back().acc_top = acc_top.data_ptr<float>() + at, tops.back().index_top = index_top.data_ptr<int32_t>() + at;
      fixed.indices.push_back(index_top.narrow(0, at, capacity));
      room_at += rooms[p], at += capacity;
    }
    const at::Tensor top_table = upload(tops, on.device());
    cuda::fixed_tops(static_cast<const cuda::FixedTop*>(top_table.data_ptr()), n, b.totals.data_ptr<int64_t>(),
                     fixed.counts.data_ptr<int64_t>(), stream());
    if (bits > 0)
      send_quantized_fixed(tensors, tops, masking, bits, fixed);
    else
      send_fixed(tensors, tops, masking, total, fixed);
    return fixed;
  }
  // Each tensor's selection (tops[p]'s) sent up to its count, in its value dtype, by one kernel.
  static void send_fixed(const std::vector<SampledTensor>& tensors, const std::vector<cuda::FixedTop>& tops,
                         bool masking, int64_t total, PackedFixed& fixed) {
    std::vector<cuda::SendSegment> sends;
    const at::TensorOptions on = tensors[0].args.grad.options();
    int64_t at = 0;
    for (size_t p = 0; p < tensors.size(); ++p) {
      const SampledTensor& t = tensors[p];
      const int64_t capacity = capacity_of(t);
      fixed.values.push_back(at::empty({capacity}, on.dtype(t.value_dtype)));
      cuda::SendSegment s;
      s.acc = tops[p].acc_top, s.index = tops[p].index_top;
      s.count = capacity, s.at = at, s.limit = fixed.counts.data_ptr<int64_t>() + p;
      s.fb = send_state("pack_sampled_fixed", t.residual, t.momentum, masking);
      s.values = fixed.values.back().data_ptr(), s.value_type = float_type(t.value_dtype);
      sends.push_back(s);
      at += capacity;
    }
    const at::Tensor table = upload(sends, on.device());
    cuda::send_segments(static_cast<const cuda::SendSegment*>(table.data_ptr()), int64_t(sends.size()), total,
                        stream());
  }
  // The same, quantized to `bits`: each tensor's codes (its room's bytes) and scales, a block a tensor.
  static void send_quantized_fixed(const std::vector<SampledTensor>& tensors, const std::vector<cuda::FixedTop>& tops,
                                   bool masking, int bits, PackedFixed& fixed) {
    std::vector<cuda::QuantizeSegment> sends;
    const at::TensorOptions on = tensors[0].args.grad.options();
    const int64_t n = int64_t(tensors.size()), scale_count = quantized_scales(bits);
    int64_t code_bytes = 0;
    for (const SampledTensor& t : tensors) code_bytes += quantized_bytes(capacity_of(t), bits);
    at::Tensor codes = at::empty({code_bytes}, on.dtype(at::kByte)),
               scales = at::empty({n, scale_count}, on.dtype(at::kFloat));
    int64_t at = 0;
    for (int64_t p = 0; p < n; ++p) {
      const SampledTensor& t = tensors[p];
      const int64_t bytes = quantized_bytes(capacity_of(t), bits);
      fixed.values.push_back(codes.narrow(0, at, bytes));
      fixed.scales.push_back(scales.select(0, p));
      cuda::QuantizeSegment q;
      q.acc = tops[p].acc_top, q.index = tops[p].index_top, q.limit = fixed.counts.data_ptr<int64_t>() + p;
      q.fb = send_state("pack_quantized_fixed", t.residual, t.momentum, masking);
      q.codes = codes.data_ptr<uint8_t>() + at, q.scales = scales.data_ptr<float>() + p * scale_count;
      sends.push_back(q);
      at += bytes;
    }
    const at::Tensor table = upload(sends, on.device());
    cuda::quantize_segments(static_cast<const cuda::QuantizeSegment*>(table.data_ptr()), n, bits, stream());
  }
  // t's row of fixed_tops' table, but where its selection goes: its candidates (room of them)
  // and every element's acc (its state, or its gradient).
  static cuda::FixedTop fixed_top(const SampledTensor& t, const float* acc, const int32_t* index, int64_t room) {
    cuda::FixedTop top;
    top.acc = acc, top.index = index, top.room = room;
    top.k = t.plan[0], top.too_few = t.plan[2], top.too_many = t.plan[3];
    const c10::optional<at::Tensor>& state = t.residual ? t.residual : t.momentum;
    top.every = state ? state->data_ptr() : t.args.grad.data_ptr();
    top.every_type = state ? cuda::FloatType::kFloat32 : float_type(t.args.grad.scalar_type());
    top.numel = t.args.grad.numel();
    return top;
  }
};

// DGC's dense route and clipping over a bucket: its clipping factors and momentum steps, each a
// fixed number of launches over a table of the bucket's gradients.
struct CudaDenseSteps {
  // Every gradient's clipping factor in two kernels (segments.cu's clip_segments).
  static void clip_factors(const std::vector<ClipTensor>& clips) {
    std::vector<cuda::ClipSegment> table;
    int64_t tiles = 0;
    for (const ClipTensor& c : clips) {
      cuda::ClipSegment s;
      s.grad = c.grad.data_ptr(), s.grad_type = float_type(c.grad.scalar_type());
      s.numel = c.grad.numel(), s.tile_at = tiles, tiles += square_tiles(s.numel);
      s.limit = c.limit, s.factor = c.factor.data_ptr<float>();
      table.push_back(s);
    }
    const at::TensorOptions on = clips[0].grad.options();
    const at::Tensor rows = upload(table, on.device());
    at::Tensor tile_sums = at::empty({tiles}, on.dtype(at::kDouble));
    cuda::clip_segments(static_cast<const cuda::ClipSegment*>(rows.data_ptr()), int64_t(table.size()), tiles,
                        tile_sums.data_ptr<double>(), stream());
  }

  // Every gradient's momentum step in one kernel, a thread per element over a table of them.
  static void momentum_many(const std::vector<FeedbackArgs>& grads) {
    std::vector<cuda::MomentumSegment> table;
    int64_t total = 0;
    for (const FeedbackArgs& a : grads) {
      cuda::MomentumSegment m;
      m.grad = a.grad.data_ptr();
      m.grad_type = float_type(a.grad.scalar_type());
      m.fb = a.fb;
      m.at = total, total += a.grad.numel();
      table.push_back(m);
    }
    const at::Tensor rows = upload(table, grads[0].grad.device());
    cuda::momentum_segments(static_cast<const cuda::MomentumSegment*>(rows.data_ptr()), int64_t(table.size()), total,
                            stream());
  }
};

}  // namespace torch_binding
}  // namespace sparsecomm
