// CUDA launchers for a bucket's 1-/2-bit sends and for the fixed segments of csrc/kernels/quantize.h
// (launchers.h, "quantized.cu"): each launched once for every tensor of the bucket over a table,
// whatever their number. Every count is read on the device; nothing here synchronises with the host.
#include "grid.cuh"
#include "launchers.h"
#include "tiles.cuh"

namespace sparsecomm {
namespace cuda {
namespace {

// A block a tensor: the bits of send_quantized_kernel (the same quantize_block) at its count.
__global__ void quantize_segments_kernel(const QuantizeSegment* sends, int64_t n, int bits) {
  __shared__ double scratch[kQuantThreads];
  __shared__ float scale[4];
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {  // (the same s for the whole block)
    const QuantizeSegment& q = sends[s];
    quantize_block(q.acc, q.index, *q.limit, q.fb, bits, q.codes, q.scales, scratch, scale);
  }
}

__global__ void fixed_segments_kernel(const FixedSegmentSend* sends, int64_t n, int64_t total) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const FixedSegmentSend& s = sends[segment_of(sends, n, t, [](const FixedSegmentSend& g) { return g.at; })];
    write_fixed_segment_item(s, t - s.at);
  }
}

__global__ void segment_starts_kernel(const SegmentRead* reads, int64_t n, int bits, int64_t* starts) {
  for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s < n; s += int64_t(gridDim.x) * blockDim.x) {
    const SegmentRead& r = reads[s];
    const QuantizedSegment layout(r.room, bits, r.buckets);
    int64_t start = 0;
    for (int64_t b = 0; b < r.buckets; ++b) {
      starts[r.bucket_at + b] = start;
      uint16_t count;
      memcpy(&count, r.segment + layout.counts_at + kWireOffsetBytes * b, kWireOffsetBytes);
      start += count;
    }
  }
}

__global__ void segment_entries_kernel(const SegmentRead* reads, int64_t n, int64_t total, int bits,
                                       const int64_t* starts, float* values, int32_t* places) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const SegmentRead& r = reads[segment_of(reads, n, e, [](const SegmentRead& g) { return g.at; })];
    const QuantizedSegment layout(r.room, bits, r.buckets);
    const int64_t j = e - r.at;
    int64_t count;
    memcpy(&count, r.segment, sizeof(count));
    if (j >= count) {
      values[e] = -0.0f;
      places[e] = int32_t(r.place);
      continue;
    }
    const int64_t bucket = segment_of(starts + r.bucket_at, r.buckets, j, [](int64_t start) { return start; });
    uint16_t offset;
    memcpy(&offset, r.segment + layout.offsets_at + kWireOffsetBytes * j, kWireOffsetBytes);
    float value;
    memcpy(&value, r.segment + layout.scales_at + sizeof(float) * read_code(r.segment + layout.codes_at, j, bits),
           sizeof(value));
    values[e] = value;
    places[e] = int32_t(r.place + bucket * kWireBucket + offset);
  }
}

}  // namespace

void quantize_segments(const QuantizeSegment* sends, int64_t n, int bits, cudaStream_t stream) {
  if (n == 0) return;
  quantize_segments_kernel<<<grid_for(n, 1), kQuantThreads, 0, stream>>>(sends, n, bits);
  check_launch("quantize_segments_kernel");
}

void fixed_segments(const FixedSegmentSend* sends, int64_t n, int64_t total, cudaStream_t stream) {
  if (total == 0) return;
  fixed_segments_kernel<<<grid_for(total), kThreads, 0, stream>>>(sends, n, total);
  check_launch("fixed_segments_kernel");
}

void segment_starts(const SegmentRead* reads, int64_t n, int bits, int64_t* starts, cudaStream_t stream) {
  if (n == 0) return;
  segment_starts_kernel<<<grid_for(n), kThreads, 0, stream>>>(reads, n, bits, starts);
  check_launch("segment_starts_kernel");
}

void segment_entries(const SegmentRead* reads, int64_t n, int64_t total, int bits, const int64_t* starts, float* values,
                     int32_t* places, cudaStream_t stream) {
  if (total == 0) return;
  segment_entries_kernel<<<grid_for(total), kThreads, 0, stream>>>(reads, n, total, bits, starts, values, places);
  check_launch("segment_entries_kernel");
}

}  // namespace cuda
}  // namespace sparsecomm
