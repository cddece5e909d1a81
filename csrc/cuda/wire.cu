// CUDA launchers for the wire rows of csrc/kernels/wire.h, a thread per row. Writing them needs no
// scan: an element's row follows from its bucket, a marker's from a binary search of the sorted
// indices. Reading them needs one: each row's bucket is its last marker's (a running max between
// the two kernels). No host read either way.
#include <cstring>

#include "../kernels/wire.h"
#include "grid.cuh"
#include "launchers.h"

namespace sparsecomm {
namespace cuda {
namespace {

// Row t of a send's rows (t < count + buckets): element j goes to row j + (its bucket - the first)
// + 1, after its bucket's marker; marker m to row m + the elements of the buckets before it.
template <int kValueBytes>
__device__ void write_wire_row(const uint8_t* values, const int32_t* index, int64_t count, int64_t first, int64_t t,
                               uint8_t* rows) {
  constexpr int64_t kWidth = kWireOffsetBytes + kValueBytes;
  if (t < count) {
    const int64_t bucket = index[t] / kWireBucket;
    const uint16_t offset = uint16_t(index[t] - bucket * kWireBucket);
    uint8_t* row = rows + (t + bucket - first + 1) * kWidth;
    memcpy(row, &offset, kWireOffsetBytes);
    memcpy(row + kWireOffsetBytes, values + t * kValueBytes, kValueBytes);
    return;
  }
  const int64_t m = t - count, number = first + m;
  const int64_t before = first_at_or_past(index, count, number * kWireBucket);
  const uint16_t marker[2] = {kWireMarker, uint16_t(number)};
  uint8_t* row = rows + (m + before) * kWidth;
  memcpy(row, marker, sizeof(marker));
  for (int64_t b = sizeof(marker); b < kWidth; ++b) row[b] = 0;
}

template <int kValueBytes>
__global__ void wire_rows_kernel(const uint8_t* values, const int32_t* index, int64_t count, int64_t first,
                                 int64_t buckets, uint8_t* rows) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < count + buckets;
       t += int64_t(gridDim.x) * blockDim.x)
    write_wire_row<kValueBytes>(values, index, count, first, t, rows);
}

// A bucket's sends (of [0, length): their first bucket is 0), row t of all their rows. A send of
// fixed capacity (limit) has room for count elements' rows and its markers'; its first row's
// thread writes its number of rows.
__global__ void wire_segments_kernel(const WireSegment* sends, int64_t n, int64_t total) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const WireSegment& w = sends[segment_of(sends, n, t, [](const WireSegment& g) { return g.at; })];
    const auto* values = static_cast<const uint8_t*>(w.values);
    const int64_t count = w.limit ? *w.limit : w.count, row = t - w.at;
    if (w.rows_count && row == 0) *w.rows_count = count + w.buckets;
    if (row >= count + w.buckets) continue;  // (a fixed capacity's room past its rows)
    if (w.value_bytes == 2)
      write_wire_row<2>(values, w.index, count, 0, row, w.rows);
    else
      write_wire_row<4>(values, w.index, count, 0, row, w.rows);
  }
}

// marks[r] = r where row r is a marker, else -1.
__global__ void wire_marks_kernel(const uint8_t* rows, int64_t count, int64_t width, int64_t* marks) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < count; r += int64_t(gridDim.x) * blockDim.x) {
    uint16_t offset;
    memcpy(&offset, rows + r * width, kWireOffsetBytes);
    marks[r] = offset == kWireMarker ? r : -1;
  }
}

// Row r's element, its bucket the number in its last marker (last[r]; row 0's where none came
// before). A marker reads as -0.0 at its bucket's first index, which adds nothing to a sum.
__global__ void wire_columns_kernel(const uint8_t* rows, int64_t count, int64_t value_bytes, const int64_t* last,
                                    uint8_t* values, int32_t* index) {
  const int64_t width = kWireOffsetBytes + value_bytes;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < count; r += int64_t(gridDim.x) * blockDim.x) {
    const uint8_t* row = rows + r * width;
    uint16_t offset, number;
    memcpy(&offset, row, kWireOffsetBytes);
    memcpy(&number, rows + (last[r] > 0 ? last[r] : 0) * width + kWireOffsetBytes, sizeof(number));
    const bool marker = offset == kWireMarker;
    index[r] = int32_t(int64_t(number) * kWireBucket + (marker ? 0 : offset));
    uint8_t* value = values + r * value_bytes;
    if (!marker) {
      memcpy(value, row + kWireOffsetBytes, value_bytes);
      continue;
    }
    for (int64_t b = 0; b + 1 < value_bytes; ++b) value[b] = 0;
    value[value_bytes - 1] = 0x80;  // -0.0: the sign bit alone, in the last byte (little-endian)
  }
}

}  // namespace

void wire_rows(const void* values, int64_t value_bytes, const int32_t* index, int64_t count, int64_t start,
               int64_t length, uint8_t* rows, cudaStream_t stream) {
  const int64_t first = start / kWireBucket, buckets = wire_buckets(start, length);
  if (count + buckets == 0) return;
  const auto* v = static_cast<const uint8_t*>(values);
  if (value_bytes == 2) {
    wire_rows_kernel<2><<<grid_for(count + buckets), kThreads, 0, stream>>>(v, index, count, first, buckets, rows);
    check_launch("wire_rows_kernel");
  } else {
    wire_rows_kernel<4><<<grid_for(count + buckets), kThreads, 0, stream>>>(v, index, count, first, buckets, rows);
    check_launch("wire_rows_kernel");
  }
}

void wire_segments(const WireSegment* sends, int64_t n, int64_t total, cudaStream_t stream) {
  if (total == 0) return;
  wire_segments_kernel<<<grid_for(total), kThreads, 0, stream>>>(sends, n, total);
  check_launch("wire_segments_kernel");
}

void wire_marks(const uint8_t* rows, int64_t count, int64_t width, int64_t* marks, cudaStream_t stream) {
  if (count == 0) return;
  wire_marks_kernel<<<grid_for(count), kThreads, 0, stream>>>(rows, count, width, marks);
  check_launch("wire_marks_kernel");
}

void wire_columns(const uint8_t* rows, int64_t count, int64_t value_bytes, const int64_t* last, void* values,
                  int32_t* index, cudaStream_t stream) {
  if (count == 0) return;
  wire_columns_kernel<<<grid_for(count), kThreads, 0, stream>>>(rows, count, value_bytes, last,
                                                                static_cast<uint8_t*>(values), index);
  check_launch("wire_columns_kernel");
}

}  // namespace cuda
}  // namespace sparsecomm
