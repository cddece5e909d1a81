// CUDA launcher for the wire rows of csrc/kernels/wire.h: one kernel, a thread per row. Rows do not
// depend on each other: an element's row follows from its bucket, a marker's from a binary search
// of the sorted indices, so no scan or host read is needed.
#include <cstring>

#include "../kernels/wire.h"
#include "grid.cuh"
#include "launchers.h"

namespace sparsecomm {
namespace cuda {
namespace {

// Element j goes to row j + (its bucket - the first) + 1, after its bucket's marker; marker m to
// row m + the elements of the buckets before it.
template <int kValueBytes>
__global__ void wire_rows_kernel(const uint8_t* values, const int32_t* index, int64_t count, int64_t first,
                                 int64_t buckets, uint8_t* rows) {
  constexpr int64_t kWidth = kWireOffsetBytes + kValueBytes;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < count + buckets;
       t += int64_t(gridDim.x) * blockDim.x) {
    if (t < count) {
      const int64_t bucket = index[t] / kWireBucket;
      const uint16_t offset = uint16_t(index[t] - bucket * kWireBucket);
      uint8_t* row = rows + (t + bucket - first + 1) * kWidth;
      memcpy(row, &offset, kWireOffsetBytes);
      memcpy(row + kWireOffsetBytes, values + t * kValueBytes, kValueBytes);
      continue;
    }
    const int64_t m = t - count, number = first + m, bucket_start = number * kWireBucket;
    int64_t before = 0, end = count;  // the first index at or past the bucket's start
    while (before < end) {
      const int64_t mid = (before + end) / 2;
      if (index[mid] < bucket_start)
        before = mid + 1;
      else
        end = mid;
    }
    const uint16_t marker[2] = {kWireMarker, uint16_t(number)};
    uint8_t* row = rows + (m + before) * kWidth;
    memcpy(row, marker, sizeof(marker));
    for (int64_t b = sizeof(marker); b < kWidth; ++b) row[b] = 0;
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

}  // namespace cuda
}  // namespace sparsecomm
