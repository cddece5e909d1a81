// CPU launchers: raw pointers and sizes, no framework types. Instantiated for
// T = float, half16, bfloat16. Called by csrc/torch and csrc/tensorflow.
#pragma once
#include <cstdint>

#include "../kernels/common.h"

namespace sparsecomm {
namespace cpu {

template <typename T>
void block_pack(const T* grad, const float* residual_in, float* residual_out, T* values, int64_t numel, int64_t start,
                int64_t length);

template <typename T>
void block_unpack(const T* values, T* dense, int64_t numel, int64_t start, int64_t length, float scale);

}  // namespace cpu
}  // namespace sparsecomm

#include <vector>

#include "../kernels/feedback.h"
#include "../kernels/permutation.h"
#include "../kernels/quantize.h"
#include "../kernels/sample.h"
#include "../kernels/squares.h"
#include "../kernels/wire.h"

namespace sparsecomm {
namespace cpu {

// The rank-th largest |acc| over the sampled positions (+inf for an empty tensor).
template <typename T>
float sample_threshold(const T* grad, const Feedback& fb, int64_t numel, const SamplePlan& plan);

// One pass: writes the state of every element as if nothing were sent (feedback.h) and
// appends the candidates, selected(acc, threshold), to (acc, index) in index order.
// Candidate lists are reused from call to call: growing a fresh std::vector every step costs
// reallocations and fresh pages (mmap and page faults, slow under a sandboxing kernel) that
// dominated the pass at 1% density. A list grown past kKeptCandidates (a fallback that took
// every element) gives its memory back after use.
constexpr size_t kKeptCandidates = size_t(1) << 22;

template <typename V>
void kept_capacity(V& list) {
  if (list.capacity() > kKeptCandidates) V().swap(list);
}

template <typename T>
void accumulate_candidates(const T* grad, const Feedback& fb, int64_t numel, float threshold, std::vector<float>& acc,
                           std::vector<int32_t>& index);

// Keeps, in place and in index order, the k candidates of largest magnitude (ties: lower
// index first). Returns the new count, min(count, k).
int64_t select_top(float* acc, int32_t* index, int64_t count, int64_t k);

// Sends the selected candidates: values[j] = T(acc[j]); their state keeps only the rounding
// error (and loses its momentum when masking).
template <typename T>
void send_selected(const float* acc, const int32_t* index, int64_t count, const Feedback& fb, T* values);

// dense = T(scale * sum of the values at each index), duplicates adding in input order.
// dense may be any buffer of numel elements (its old contents are overwritten).
template <typename T>
void sparse_unpack(const T* values, const int32_t* index, int64_t count, float scale, int64_t numel, T* dense);

// The state takes acc for every element, nothing is selected (feedback.h's keep): one pass.
template <typename T>
void accumulate(const T* grad, const Feedback& fb, int64_t numel);

// DGC's dense route: u = fb.momentum * momentum_in + grad into momentum_out and out (feedback.h's
// momentum_element), one pass; fb has no residual; out may be grad.
template <typename T>
void momentum_step(const T* grad, const Feedback& fb, int64_t numel, T* out);

// *out = the sum of the squares of x[0, numel) in float64, in squares.h's order; tile_sums is
// scratch for square_tiles(numel) doubles.
template <typename T>
void sum_of_squares(const T* x, int64_t numel, double* tile_sums, double* out);

// The wire rows of sparsecomm/core/wire.py (kernels/wire.h) of a send of [start, start + length):
// count + wire_buckets(start, length) rows of 2 + value_bytes. False where index is not strictly
// ascending inside the range (nothing is sent then).
bool wire_rows(const void* values, int64_t value_bytes, const int32_t* index, int64_t count, int64_t start,
               int64_t length, uint8_t* rows);
// The elements of any sequence of sends (marker rows dropped), in order: how many were written,
// or -1 where an element comes before a marker or lands past int32.
int64_t wire_columns(const uint8_t* rows, int64_t count, int64_t value_bytes, void* values, int32_t* index);

// The k shared-seed random indices of permutation.h, sorted ascending.
void random_k_indices(const Permutation& perm, int64_t k, int32_t* out);

// Sends the selected candidates quantized to `bits` (1 or 2; quantize.h): codes (packed,
// quantized_bytes(count, bits)) and scales (quantized_scales(bits) float32). The state of each
// sent element keeps acc - decoded value (and loses its momentum when masking).
void send_quantized(const float* acc, const int32_t* index, int64_t count, const Feedback& fb, int bits, uint8_t* codes,
                    float* scales);

// values[j] = scales[code j] for j < count.
void dequantize(const uint8_t* codes, const float* scales, int64_t count, int bits, float* values);

// A 1-/2-bit segment's indices (sparsecomm/core/wire.py): each of `buckets` buckets' count, then
// each index's offset in its bucket, as uint16 bytes. False where index is not strictly
// ascending inside the buckets. And back: false where the counts do not add up to `count`.
bool segment_offsets(const int32_t* index, int64_t count, int64_t buckets, uint8_t* counts, uint8_t* offsets);
bool segment_index(const uint8_t* counts, int64_t buckets, const uint8_t* offsets, int64_t count, int32_t* index);

// A bucket's fixed segments (quantize.h's write_fixed_segment_item, every item of each in turn).
// Returns -1, or the first send whose count lies outside [0, room] or whose indices up to it are
// not strictly ascending inside its buckets (it and those after it not written).
int64_t fixed_segments(const FixedSegmentSend* sends, int64_t n);

}  // namespace cpu
}  // namespace sparsecomm
