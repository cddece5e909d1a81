// The wire rows of sparsecomm/core/wire.py: a tensor cut into buckets of kWireBucket elements;
// a send of [start, start + length) holds, for each bucket the range touches, a marker row
// (kWireMarker, then the bucket's number as uint16) and then the rows of that bucket's elements
// (their uint16 offset in the bucket, then the value's bytes).
#pragma once
#include <cstdint>

#include "common.h"

namespace sparsecomm {

constexpr int64_t kWireBucket = 65535;
constexpr uint16_t kWireMarker = 0xFFFF;
constexpr int64_t kWireOffsetBytes = sizeof(uint16_t);

// Marker rows in a send of [start, start + length).
inline int64_t wire_buckets(int64_t start, int64_t length) {
  return length <= 0 ? 0 : (start + length - 1) / kWireBucket - start / kWireBucket + 1;
}

// The first of index[0, count) (ascending) at or past `value`: where a bucket's elements start.
SC_HOST_DEVICE int64_t first_at_or_past(const int32_t* index, int64_t count, int64_t value) {
  int64_t lo = 0, hi = count;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (index[mid] < value)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace sparsecomm
