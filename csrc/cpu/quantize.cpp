// CPU launchers for csrc/kernels/quantize.h: two passes over the (few) sent values.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "launchers.h"
#include "scatter.h"

namespace sparsecomm {
namespace cpu {

void send_quantized(const float* acc, const int32_t* index, int64_t count, const Feedback& fb, int bits, uint8_t* codes,
                    float* scales) {
  double split_sum = 0.0;
  for (int64_t j = 0; j < count; ++j) split_sum += std::fabs(acc[j]);
  const float split = count ? float(split_sum / double(count)) : 0.0f;  // mean |v| (2 bit only)
  double sums[4] = {0, 0, 0, 0};
  int64_t counts[4] = {0, 0, 0, 0};
  for (int64_t j = 0; j < count; ++j) {
    const uint32_t code = quantize_code(acc[j], bits, split);
    sums[code] += acc[j];
    counts[code] += 1;
  }
  for (int c = 0; c < quantized_scales(bits); ++c) scales[c] = counts[c] ? float(sums[c] / double(counts[c])) : 0.0f;
  std::fill(codes, codes + quantized_bytes(count, bits), uint8_t(0));
  for (int64_t j = 0; j < count; ++j) {
    if (j + kPrefetchAhead < count) prefetch_sent_state(fb, index[j + kPrefetchAhead]);
    const uint32_t code = quantize_code(acc[j], bits, split);
    const int64_t bit = j * bits;
    codes[bit >> 3] |= uint8_t(code << (bit & 7));
    const float left = acc[j] - scales[code];
    if (fb.residual_out) fb.residual_out[index[j]] = finite_or_zero(left);  // feedback.h's NaN/Inf policy
    if (fb.momentum_out && fb.masking) fb.momentum_out[index[j]] = 0.0f;
  }
}

void dequantize(const uint8_t* codes, const float* scales, int64_t count, int bits, float* values) {
  for (int64_t j = 0; j < count; ++j) values[j] = scales[read_code(codes, j, bits)];
}

// uint16 through memcpy: a segment's parts are 2-byte aligned, but the bytes are uint8 to C++.
bool segment_offsets(const int32_t* index, int64_t count, int64_t buckets, uint8_t* counts, uint8_t* offsets) {
  int64_t j = 0, previous = -1;
  for (int64_t b = 0; b < buckets; ++b) {
    const int64_t first = j, end = (b + 1) * kWireBucket;
    for (; j < count && index[j] < end; ++j) {
      if (index[j] <= previous) return false;
      previous = index[j];
      const uint16_t offset = uint16_t(index[j] - b * kWireBucket);
      std::memcpy(offsets + kWireOffsetBytes * j, &offset, kWireOffsetBytes);
    }
    const uint16_t n = uint16_t(j - first);
    std::memcpy(counts + kWireOffsetBytes * b, &n, kWireOffsetBytes);
  }
  return j == count;
}

bool segment_index(const uint8_t* counts, int64_t buckets, const uint8_t* offsets, int64_t count, int32_t* index) {
  int64_t j = 0;
  for (int64_t b = 0; b < buckets; ++b) {
    uint16_t n;
    std::memcpy(&n, counts + kWireOffsetBytes * b, kWireOffsetBytes);
    if (j + n > count) return false;
    for (const int64_t end = j + n; j < end; ++j) {
      uint16_t offset;
      std::memcpy(&offset, offsets + kWireOffsetBytes * j, kWireOffsetBytes);
      index[j] = int32_t(b * kWireBucket + offset);
    }
  }
  return j == count;
}

int64_t fixed_segments(const FixedSegmentSend* sends, int64_t n) {
  for (int64_t p = 0; p < n; ++p) {
    const FixedSegmentSend& s = sends[p];
    const int64_t count = *s.count, end = s.buckets * kWireBucket;
    if (count < 0 || count > s.room) return p;
    for (int64_t j = 0; j < count; ++j)
      if (s.index[j] < (j ? int64_t(s.index[j - 1]) + 1 : 0) || s.index[j] >= end) return p;
    for (int64_t t = 0; t < fixed_segment_items(s); ++t) write_fixed_segment_item(s, t);
  }
  return -1;
}

}  // namespace cpu
}  // namespace sparsecomm
