// The CUDA device policy's wire and segment phases (csrc/torch/common.h): 1-/2-bit segments'
// bytes and counts, wire rows and columns (csrc/cuda/wire.cu), and a DDP bucket's all_gather
// unpacked in one pass. CudaDevice (cuda.cpp) takes them by inheritance.
#pragma once
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "../cuda/launchers.h"
#include "cuda_bucket.h"
#include "quantize.h"
#include "select.h"

namespace sparsecomm {
namespace torch_binding {

// Where each of `outs` starts, in elements from the lowest of them: one kernel writes them all
// through that one's pointer, so they must share an allocation (a DDP bucket's gradients do). An
// empty one (whose data pointer may be null) receives nothing: its place is 0.
struct Places {
  size_t lowest = 0;
  std::vector<int64_t> of;

  Places(const char* op, at::TensorList outs) {
    for (size_t p = 1; p < outs.size(); ++p)
      if (outs[p].numel() > 0 && (outs[lowest].numel() == 0 || outs[p].data_ptr() < outs[lowest].data_ptr()))
        lowest = p;
    const auto* base = static_cast<const char*>(outs[lowest].data_ptr());
    const int64_t size = int64_t(outs[lowest].element_size());
    for (const at::Tensor& out : outs) {
      if (out.numel() == 0) {
        of.push_back(0);
        continue;
      }
      const int64_t bytes = static_cast<const char*>(out.data_ptr()) - base;
      TORCH_CHECK(out.storage().is_alias_of(outs[lowest].storage()) && bytes % size == 0, op,
                  ": on CUDA, outs should be views of one allocation (a DDP bucket's gradients)");
      TORCH_CHECK(bytes / size + out.numel() <= (int64_t(1) << 31), op,
                  ": outs should span fewer than 2^31 elements, got ", bytes / size + out.numel());
      of.push_back(bytes / size);
    }
  }
};

// For each row of a rank's regions: its tensor's count slot, its row number in the region and its
// tensor's place (int64 [3, rows]), built on the host and copied without waiting (pinned memory).
inline at::Tensor row_table(const std::vector<int64_t>& slots, const std::vector<int64_t>& rows_of,
                            const std::vector<int64_t>& places, const at::Device& device) {
  int64_t rows = 0;
  for (const int64_t n : rows_of) rows += n;
  at::Tensor table = at::empty({3, rows}, at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
  int64_t* slot = table.data_ptr<int64_t>();
  int64_t *row = slot + rows, *place = row + rows;
  for (size_t p = 0; p < rows_of.size(); ++p)
    for (int64_t j = 0; j < rows_of[p]; ++j, ++slot, ++row, ++place) {
      *slot = slots[p];
      *row = j;
      *place = places[p];
    }
  return table.to(device, /*non_blocking=*/true);
}

struct CudaWire {
  // Raw bytes (quantize.h's segments) by torch's copies and fills on the stream; a count is read
  // back to the host (a synchronisation: the walk over the segments needs each one).
  static void copy_bytes(const at::Tensor& from, const at::Tensor& to) {
    if (from.nbytes() > 0) to.view(at::kByte).copy_(from.view(at::kByte));  // (an empty one's stride may be 0)
  }
  static void zero_bytes(const at::Tensor& t) { t.zero_(); }
  static void write_count(const at::Tensor& segment, int64_t count) {
    segment.narrow(0, 0, sizeof(count)).view(at::kLong).fill_(count);
  }
  static int64_t read_count(const at::Tensor& gathered, int64_t at) {
    const at::Tensor bytes = read_back(gathered.narrow(0, at, sizeof(int64_t)));
    int64_t count;
    std::memcpy(&count, bytes.data_ptr<uint8_t>(), sizeof(count));
    return count;
  }

  // A segment's bucket counts and offsets (uint16 bits in int16) by torch's ops on the stream; its
  // indices back by repeating each bucket's number its count times (the count is known).
  static void segment_offsets(const at::Tensor& index, const at::Tensor& counts, const at::Tensor& offsets) {
    const at::Tensor longs = index.to(at::kLong), bucket = longs.div(kWireBucket, "floor");
    offsets.view(at::kShort).copy_(longs - bucket * kWireBucket);
    const at::Tensor per_bucket = at::zeros({counts.numel() / kWireOffsetBytes}, longs.options());
    counts.view(at::kShort).copy_(per_bucket.index_add(0, bucket, at::ones_like(bucket)));
  }
  static void segment_index(const at::Tensor& counts, const at::Tensor& offsets, const at::Tensor& index) {
    const at::Tensor per_bucket = counts.view(at::kShort).to(at::kLong).bitwise_and(0xFFFF);
    const at::Tensor bucket = at::repeat_interleave(at::arange(per_bucket.numel(), per_bucket.options()), per_bucket,
                                                    /*dim=*/0, /*output_size=*/index.numel());
    index.copy_(bucket * kWireBucket + offsets.view(at::kShort).to(at::kLong).bitwise_and(0xFFFF));
  }

  // One kernel (csrc/cuda/wire.cu), a thread per row. Not checked (it would need a synchronisation).
  static void wire_rows(const at::Tensor& values, const at::Tensor& index, int64_t start, int64_t length,
                        const at::Tensor& rows) {
    cuda::wire_rows(values.data_ptr(), values.element_size(), index.data_ptr<int32_t>(), index.numel(), start, length,
                    rows.data_ptr<uint8_t>(), stream());
  }
  // Two kernels and torch's running max (csrc/cuda/wire.cu): each row's bucket is its last
  // marker's. Not exact: a marker stays, as -0.0 at its bucket's first index (which adds nothing
  // to any sum: an unpack needs no size from the host). Exact: the markers are dropped (a
  // synchronisation, for the count).
  static std::tuple<at::Tensor, at::Tensor> wire_columns(const at::Tensor& rows, at::ScalarType value_dtype,
                                                         bool exact) {
    const int64_t count = rows.size(0), width = rows.size(1);
    at::Tensor values = at::empty({count}, rows.options().dtype(value_dtype));
    at::Tensor index = at::empty({count}, rows.options().dtype(at::kInt));
    if (count == 0) return {values, index};
    at::Tensor marks = at::empty({count}, rows.options().dtype(at::kLong));
    cuda::wire_marks(rows.data_ptr<uint8_t>(), count, width, marks.data_ptr<int64_t>(), stream());
    const at::Tensor last = std::get<0>(marks.cummax(0));
    cuda::wire_columns(rows.data_ptr<uint8_t>(), count, width - kWireOffsetBytes, last.data_ptr<int64_t>(),
                       values.data_ptr(), index.data_ptr<int32_t>(), stream());
    if (!exact) return {values, index};
    const at::Tensor keep = marks.lt(0);
    ++host_reads;  // (masked_select reads its count back)
    return {values.masked_select(keep), index.masked_select(keep)};
  }

  // Every rank's region of every tensor, padded rows included, as one set of rows: a padded row
  // (at or past its rank's count, read on the device) adds -0.0 at its tensor's first element,
  // which changes no sum. One stable sort by place in the outs' shared allocation keeps each
  // element's contributions in rank order, as sparse_unpack does tensor by tensor.
  static void unpack_gathered_rows(const at::Tensor& gathered, at::IntArrayRef regions, int64_t width,
                                   at::ScalarType value_dtype, UnpackScale scale, at::TensorList outs) {
    const int64_t ranks = gathered.size(0), params = int64_t(outs.size());
    const Places places("sparse_unpack_gathered_rows", outs);
    std::vector<at::Tensor> parts;  // each out's rows of every rank: [ranks, its rows' bytes]
    std::vector<int64_t> slots(params), rows_of(params);
    for (int64_t p = 0; p < params; ++p) {
      slots[p] = regions[3 * p], rows_of[p] = regions[3 * p + 2] / width;
      parts.push_back(gathered.narrow(1, regions[3 * p + 1], rows_of[p] * width));
    }
    const at::Tensor table = row_table(slots, rows_of, places.of, gathered.device());  // [3, rows]: slot, row, place
    const int64_t header = (*std::max_element(slots.begin(), slots.end()) + 1) * int64_t(sizeof(int64_t));
    const at::Tensor counts = gathered.narrow(1, 0, header).contiguous().view(at::kLong);
    const at::Tensor valid = table[1].unsqueeze(0).lt(counts.index_select(1, table[0])).reshape(-1);
    // (rank by rank, each rank's outs in order: as the table's rows repeat)
    const auto [values, index] = wire_columns(at::cat(parts, 1).view({-1, width}), value_dtype, /*exact=*/false);
    const at::Tensor first = table[2].repeat({ranks});
    const at::Tensor place = at::where(valid, index.to(at::kLong) + first, first).to(at::kInt);
    const at::Tensor kept = at::where(valid, values, at::scalar_tensor(-0.0, values.options()));
    sum_at_places("sparse_unpack_gathered_rows", kept, place, scale, outs, places);
  }

  // The outs zeroed, then values[e] (cast to their dtype) added at place[e] of their shared
  // allocation: one stable sort keeps each element's contributions in the order they come, as
  // sparse_unpack does tensor by tensor.
  static void sum_at_places(const char* op, const at::Tensor& values, const at::Tensor& place, UnpackScale scale,
                            at::TensorList outs, const Places& places) {
    at::_foreach_zero_(outs);
    const auto [sorted_place, order] = place.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
    SC_DISPATCH_FLOAT_TYPES(outs[0].scalar_type(), op, [&] {
      const at::Tensor cast = values.to(outs[0].scalar_type());
      cuda::sparse_unpack_sorted<scalar_t>(data_as<scalar_t>(cast), sorted_place.data_ptr<int32_t>(),
                                           order.data_ptr<int64_t>(), cast.numel(), scale,
                                           data_as<scalar_t>(outs[places.lowest]), stream());
    });
  }

  // A bucket's fixed segments in one kernel, a thread per item (kernels/quantize.h). Not checked (it
  // would need a synchronisation).
  static void write_fixed_segments(const std::vector<FixedSegmentSend>& sends, int64_t items,
                                   const at::Device& device) {
    const at::Tensor table = upload(sends, device);
    cuda::fixed_segments(static_cast<const FixedSegmentSend*>(table.data_ptr()), int64_t(sends.size()), items,
                         stream());
  }

  // Every rank's fixed segment of every tensor, rank after rank, as one set of entries: each
  // bucket's first entry (segment_starts), then each entry's value and place (segment_entries); an
  // entry at or past its rank's count (read on the device) adds -0.0 at its tensor's first element,
  // which changes no sum. Then one sum at the places, as the rows' unpack does.
  static void unpack_gathered_segments(const at::Tensor& gathered, const std::vector<SegmentRegion>& regions, int bits,
                                       UnpackScale scale, at::TensorList outs) {
    const Places places("sparse_unpack_gathered_segments", outs);
    const int64_t ranks = gathered.size(0), chunk = gathered.size(1);
    std::vector<cuda::SegmentRead> reads;
    int64_t buckets = 0, entries = 0;
    for (int64_t r = 0; r < ranks; ++r)
      for (size_t p = 0; p < outs.size(); ++p) {
        cuda::SegmentRead s;
        s.segment = gathered.data_ptr<uint8_t>() + r * chunk + regions[p].offset;
        s.room = regions[p].room, s.buckets = regions[p].buckets, s.place = places.of[p];
        s.bucket_at = buckets, s.at = entries;
        buckets += s.buckets, entries += s.room;
        reads.push_back(s);
      }
    const at::TensorOptions on = gathered.options();
    const at::Tensor table = upload(reads, gathered.device());
    at::Tensor starts = at::empty({buckets}, on.dtype(at::kLong));
    at::Tensor values = at::empty({entries}, on.dtype(at::kFloat)), place = at::empty({entries}, on.dtype(at::kInt));
    const auto* rows = static_cast<const cuda::SegmentRead*>(table.data_ptr());
    const int64_t n = int64_t(reads.size());
    cuda::segment_starts(rows, n, bits, starts.data_ptr<int64_t>(), stream());
    cuda::segment_entries(rows, n, entries, bits, starts.data_ptr<int64_t>(), values.data_ptr<float>(),
                          place.data_ptr<int32_t>(), stream());
    sum_at_places("sparse_unpack_gathered_segments", values, place, scale, outs, places);
  }
};

}  // namespace torch_binding
}  // namespace sparsecomm
