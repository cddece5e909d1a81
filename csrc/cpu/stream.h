// Writes of a whole output range that bypass the caches (non-temporal stores). An unpack
// writes every element of the dense result and reads none: a plain store first reads each
// cache line from memory (read for ownership), doubling the traffic of a write-only pass.
// Only for outputs too large to stay in cache anyway: a small gradient is better left in cache
// for the optimizer that reads it next. Needs SSE2 (every x86-64); elsewhere plain stores.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sparsecomm {
namespace cpu {

// Outputs from this size on are streamed (larger than this machine kind's caches).
constexpr int64_t kStreamMinBytes = int64_t(32) << 20;

inline bool worth_streaming(int64_t output_bytes) { return output_bytes >= kStreamMinBytes; }

#if defined(__SSE2__)
// Runs store16(j) on each 16-byte-aligned 16 bytes of dst[0, bytes) and plain(j, n) on the
// unaligned head and the tail (offsets j from dst).
template <typename Store16, typename Plain>
inline void split_aligned(char* dst, int64_t bytes, Store16 store16, Plain plain) {
  const int64_t head = std::min<int64_t>(bytes, (16 - int64_t(reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
  plain(0, head);
  int64_t j = head;
  for (; j + 16 <= bytes; j += 16) store16(j);
  plain(j, bytes - j);
}
#endif

// dst[0, bytes) = src[0, bytes), streamed (where dst is 16-byte aligned) if `stream`.
inline void copy_streaming(void* dst_in, const void* src_in, int64_t bytes, bool stream) {
  char* dst = static_cast<char*>(dst_in);
  const char* src = static_cast<const char*>(src_in);
  auto plain = [&](int64_t j, int64_t n) { std::memcpy(dst + j, src + j, n); };
  if (!stream) return plain(0, bytes);
#if defined(__SSE2__)
  split_aligned(
      dst, bytes,
      [&](int64_t j) {
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + j),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j)));
      },
      plain);
#else
  plain(0, bytes);
#endif
}

// dst[0, bytes) = 0, streamed (where dst is 16-byte aligned) if `stream`.
inline void zero_streaming(void* dst_in, int64_t bytes, bool stream) {
  char* dst = static_cast<char*>(dst_in);
  auto plain = [&](int64_t j, int64_t n) { std::memset(dst + j, 0, n); };
  if (!stream) return plain(0, bytes);
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128();
  split_aligned(dst, bytes, [&](int64_t j) { _mm_stream_si128(reinterpret_cast<__m128i*>(dst + j), zero); }, plain);
#else
  plain(0, bytes);
#endif
}

// Streamed stores are weakly ordered: a thread fences them before its results are read.
inline void fence_streaming() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace cpu
}  // namespace sparsecomm
