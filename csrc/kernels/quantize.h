// 1-bit and 2-bit quantization of the sent values with per-tensor scales (Aji & Heafield
// combine gradient dropping with 1-bit/2-bit quantization of the kept values). The
// quantization error goes back into the residual like any rounding error.
//
//   1 bit: code = (v >= 0). Code 1 decodes to the mean of the non-negative values, code 0
//          to the mean of the negative ones: 2 scales.
//   2 bit: code = (v >= 0) | (|v| >= mean |v|) << 1 : sign and magnitude class. Each of the
//          4 classes decodes to the mean of its values: 4 scales (0 for an empty class).
// Codes are packed little-endian: value j occupies bits [j*bits, (j+1)*bits) of the byte
// stream. NaN or Inf among the values makes their class's scale NaN or Inf (it propagates,
// like a dense allreduce would).
#pragma once
#include "common.h"
#include "wire.h"

namespace sparsecomm {

SC_HOST_DEVICE int quantized_scales(int bits) { return bits == 1 ? 2 : 4; }

SC_HOST_DEVICE int64_t quantized_bytes(int64_t count, int bits) { return (count * bits + 7) / 8; }

SC_HOST_DEVICE uint32_t quantize_code(float v, int bits, float magnitude_split) {
  const uint32_t sign = v >= 0.0f ? 1u : 0u;
  if (bits == 1) return sign;
  const float a = v < 0.0f ? -v : v;
  return sign | (a >= magnitude_split ? 2u : 0u);
}

SC_HOST_DEVICE uint32_t read_code(const uint8_t* codes, int64_t j, int bits) {
  const int64_t bit = j * bits;
  return (uint32_t(codes[bit >> 3]) >> (bit & 7)) & ((1u << bits) - 1u);
}

// A segment of sparsecomm/core/wire.py (its Segment): count int64, the scales float32, each bucket's
// count (uint16), each index's offset in its bucket (uint16), the codes, then zeros to a multiple of
// 8 bytes (the next count stays aligned). Byte offsets from its start, for `room` offsets and codes:
// the Horovod wire's segment has the room of its count; a fixed one (the DDP and FSDP wire) the room
// of its tensor's capacity, whatever its count, so that its layout is known without reading it.
struct QuantizedSegment {
  static constexpr int64_t kCountBytes = 8;
  int64_t room, buckets, scales_at, counts_at, offsets_at, codes_at, codes_end, size;
  SC_HOST_DEVICE QuantizedSegment(int64_t room, int bits, int64_t buckets)
      : room(room),
        buckets(buckets),
        scales_at(kCountBytes),
        counts_at(kCountBytes + int64_t(sizeof(float)) * quantized_scales(bits)),
        offsets_at(counts_at + kWireOffsetBytes * buckets),
        codes_at(offsets_at + kWireOffsetBytes * room),
        codes_end(codes_at + quantized_bytes(room, bits)),
        size((codes_end + kCountBytes - 1) / kCountBytes * kCountBytes) {}
};

// One tensor's fixed segment to write: send_quantized's codes and scales and the index, `room`
// entries of which the first *count were sent, and where its segment and its count's copy in the
// chunk's header go. Its layout is QuantizedSegment(room, bits, buckets) whatever the count.
struct FixedSegmentSend {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  const int32_t* index = nullptr;
  const int64_t* count = nullptr;  // in the memory of the device that writes
  int64_t room = 0, buckets = 0;   // buckets: wire_buckets(0, its tensor's numel)
  int bits = 1;
  uint8_t* segment = nullptr;
  uint8_t* header = nullptr;  // 8 bytes
  int64_t at = 0;             // its first item among all the sends' (on CUDA, a thread an item)
};

// A fixed segment is written as independent items: its count and scales, each bucket's count, each
// sent index's offset, each byte of the sent codes. Nothing is written past the count.
SC_HOST_DEVICE int64_t fixed_segment_items(const FixedSegmentSend& s) {
  return 1 + s.buckets + s.room + quantized_bytes(s.room, s.bits);
}

// Item t of s (index ascending and below its numel, not checked). memcpy: the chunk's bytes are
// uint8 to C++, and a part may be only 2-byte aligned.
SC_HOST_DEVICE void write_fixed_segment_item(const FixedSegmentSend& s, int64_t t) {
  const QuantizedSegment layout(s.room, s.bits, s.buckets);
  const int64_t count = *s.count;
  if (t == 0) {
    memcpy(s.segment, &count, sizeof(count));
    memcpy(s.header, &count, sizeof(count));
    memcpy(s.segment + layout.scales_at, s.scales, sizeof(float) * quantized_scales(s.bits));
    return;
  }
  if ((t -= 1) < s.buckets) {
    const int64_t first = first_at_or_past(s.index, count, t * kWireBucket);
    const uint16_t n = uint16_t(first_at_or_past(s.index, count, (t + 1) * kWireBucket) - first);
    memcpy(s.segment + layout.counts_at + kWireOffsetBytes * t, &n, kWireOffsetBytes);
    return;
  }
  if ((t -= s.buckets) < s.room) {
    if (t >= count) return;
    const uint16_t offset = uint16_t(s.index[t] % kWireBucket);
    memcpy(s.segment + layout.offsets_at + kWireOffsetBytes * t, &offset, kWireOffsetBytes);
    return;
  }
  if ((t -= s.room) < quantized_bytes(count, s.bits)) s.segment[layout.codes_at + t] = s.codes[t];
}

}  // namespace sparsecomm
