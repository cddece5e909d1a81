// CUDA launchers: raw device pointers, sizes and the caller's stream; no framework types,
// no host synchronisation. Instantiated for T = float, half16, bfloat16.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../kernels/feedback.h"
#include "../kernels/permutation.h"
#include "../kernels/quantize.h"
#include "../kernels/sample.h"
#include "../kernels/squares.h"

namespace sparsecomm {
namespace cuda {

template <typename T>
void block_pack(const T* grad, const float* residual_in, float* residual_out, T* values, int64_t numel, int64_t start,
                int64_t length, cudaStream_t stream);

template <typename T>
void block_unpack(const T* values, T* dense, int64_t numel, int64_t start, int64_t length, float scale,
                  cudaStream_t stream);

// Sampled threshold: gathers the sample's magnitudes into `sample` (scratch of
// sample_scratch_floats(plan.count) floats), then a radix select over the whole grid writes the
// rank-th largest to *threshold.
constexpr int64_t kSelectStateFloats = 264;  // the select's state, kept after the sample
struct SelectState {                         // in device memory, between the select's launches (tiles.cuh)
  int histogram[256];
  uint32_t prefix;    // the digits chosen so far
  int64_t remaining;  // the rank still to find among the values matching them
};
inline int64_t sample_scratch_floats(int64_t count) { return count + kSelectStateFloats; }
template <typename T>
void sample_threshold(const T* grad, const Feedback& fb, int64_t numel, const SamplePlan& plan, float* sample,
                      float* threshold, cudaStream_t stream);

// Candidates in two passes over tiles of kCandidateTile elements:
//   accumulate_count: writes the state of every element (feedback.h) and the number of
//     candidates of each tile to tile_counts;
//   compact_candidates: with tile_offsets (exclusive scan of the counts), writes the
//     candidates (acc read back from `source`, the tensor holding acc) in index order.
constexpr int64_t kCandidateTile = 4096;
SC_HOST_DEVICE int64_t candidate_tiles(int64_t numel) { return (numel + kCandidateTile - 1) / kCandidateTile; }

template <typename T>
void accumulate_count(const T* grad, const Feedback& fb, int64_t numel, const float* threshold, int32_t* tile_counts,
                      cudaStream_t stream);

template <typename S>
void compact_candidates(const S* source, int64_t numel, const float* threshold, const int64_t* tile_offsets, float* acc,
                        int32_t* index, cudaStream_t stream);

template <typename T>
void send_selected(const float* acc, const int32_t* index, int64_t count, const Feedback& fb, T* values,
                   cudaStream_t stream);

// The state takes acc for every element, nothing selected: feedback.h's accumulate_element.
template <typename T>
void accumulate(const T* grad, const Feedback& fb, int64_t numel, cudaStream_t stream);

// DGC's dense route: feedback.h's momentum_element on every element (fb has no residual; out may
// be grad).
template <typename T>
void momentum_step(const T* grad, const Feedback& fb, int64_t numel, T* out, cudaStream_t stream);

// *out (device) = the sum of the squares of x[0, numel) in float64, in squares.h's order (the
// CPU launcher's bits): a block per tile writes its sum to tile_sums (square_tiles(numel)
// doubles of scratch), then one block adds them.
template <typename T>
void sum_of_squares(const T* x, int64_t numel, double* tile_sums, double* out, cudaStream_t stream);

void send_quantized(const float* acc, const int32_t* index, int64_t count, const Feedback& fb, int bits, uint8_t* codes,
                    float* scales, cudaStream_t stream);

void dequantize(const uint8_t* codes, const float* scales, int64_t count, int bits, float* values, cudaStream_t stream);

// Deterministic scatter-add: sorted_index ascending (a stable sort of the indices) with
// order[p] the input position of sorted_index[p]. Each run of equal indices is summed in
// input order, then multiplied by the scale (a device pointer's value may be the factor:
// UnpackScale); dense must be zero beforehand.
template <typename T>
void sparse_unpack_sorted(const T* values, const int32_t* sorted_index, const int64_t* order, int64_t count,
                          UnpackScale scale, T* dense, cudaStream_t stream);

// The first k indices of the permutation, unsorted.
void random_k_indices(const Permutation& perm, int64_t k, int32_t* out, cudaStream_t stream);

// The wire rows of kernels/wire.h of a send of [start, start + length) (index strictly ascending
// in it, not checked): count + wire_buckets(start, length) rows of 2 + value_bytes (2 or 4).
void wire_rows(const void* values, int64_t value_bytes, const int32_t* index, int64_t count, int64_t start,
               int64_t length, uint8_t* rows, cudaStream_t stream);

// Reading wire rows: marks[r] = r where row r is a marker, else -1; then, with last = the running
// max of marks, each row's (value, int32 index), a marker's as -0.0 at its bucket's first index.
void wire_marks(const uint8_t* rows, int64_t count, int64_t width, int64_t* marks, cudaStream_t stream);
void wire_columns(const uint8_t* rows, int64_t count, int64_t value_bytes, const int64_t* last, void* values,
                  int32_t* index, cudaStream_t stream);

// ---- segments.cu: a bucket's sampled packs, every tensor of it in the same launches, whatever
// their number. A table of segments in device memory says where each tensor's data and its share
// of the bucket's scratch are; a thread finds its segment by a binary search of the table.
enum class FloatType : int32_t { kFloat32, kFloat16, kBFloat16 };

struct Segment {
  const void* grad = nullptr;
  FloatType grad_type = FloatType::kFloat32;
  Feedback fb;
  int64_t numel = 0;
  SamplePlan plan;  // plan.count == 0: nothing sampled, the threshold is `fixed`
  float fixed = 0.0f;
  int64_t sample_at = 0;  // where its sample starts in the bucket's samples
  int64_t block_at = 0;   // its first block of the sample's digit counts
  int64_t tile_at = 0;    // its first candidate tile
  int64_t room_at = -1;   // fixed capacity: where its candidates go (-1: in the scan's order)
  int64_t room = 0;       // fixed capacity: the most it holds (more: none is written)
};
constexpr int64_t kDigitBlockItems = 256 * 16;  // samples per block of digit counts
inline int64_t digit_blocks(int64_t samples) { return (samples + kDigitBlockItems - 1) / kDigitBlockItems; }

// thresholds[s] = segment s's sampled threshold (sample_threshold's), from `samples` floats of
// scratch, `blocks` digit blocks in all and n SelectStates.
void sample_segments(const Segment* segments, int64_t n, int64_t samples, int64_t blocks, float* sample,
                     SelectState* states, float* thresholds, cudaStream_t stream);
// accumulate_count over every segment's tiles (`tiles` in all), each at its threshold.
void count_segments(const Segment* segments, int64_t n, int64_t tiles, const float* thresholds, int32_t* tile_counts,
                    cudaStream_t stream);
// totals[s] = segment s's candidates, from the inclusive scan of the tile counts.
void segment_totals(const Segment* segments, int64_t n, const int64_t* inclusive, int64_t* totals, cudaStream_t stream);
// compact_candidates over every segment's tiles, the candidates of segment s from the scan's
// offset of its first tile on (or from room_at, if totals[s] fits its room), its acc read back
// from its residual, momentum or gradient.
void compact_segments(const Segment* segments, int64_t n, int64_t tiles, const float* thresholds,
                      const int32_t* tile_counts, const int64_t* inclusive, const int64_t* totals, float* acc,
                      int32_t* index, cudaStream_t stream);

// A bucket's exact top k of the candidates of each tensor that has too many (cpu::select_top's:
// the min(count, k) of largest magnitude, ties to the lower position, in input order). A block a
// tensor: the select's digits find the k-th largest magnitude, then one ordered pass keeps every
// larger one and the first of the equal ones.
struct TopSegment {
  const float* acc = nullptr;
  const int32_t* index = nullptr;
  int64_t count = 0, k = 0;
  float* acc_top = nullptr;  // min(count, k) each
  int32_t* index_top = nullptr;
};
void top_segments(const TopSegment* tops, int64_t n, cudaStream_t stream);

// A bucket's selections at fixed capacity, each tensor's band decided on the device from its count
// of candidates (totals[s]), so that the host reads nothing: inside its band [too_few, too_many]
// the candidates as they are; above it, the top k of the candidates (of every element where more
// came than its room holds: the same k); below it, the top k of every element. counts[s]: what
// was selected. A block a tensor.
struct FixedTop {
  const float* acc = nullptr;  // its candidates (room of them at most)
  const int32_t* index = nullptr;
  int64_t room = 0, k = 0, too_few = 0, too_many = 0;
  const void* every = nullptr;  // every element's acc: its float32 state, or its gradient
  FloatType every_type = FloatType::kFloat32;
  int64_t numel = 0;
  float* acc_top = nullptr;  // max(k, too_many) of room each
  int32_t* index_top = nullptr;
};
void fixed_tops(const FixedTop* tops, int64_t n, const int64_t* totals, int64_t* counts, cudaStream_t stream);

// A bucket's sends: send_selected of each, `total` elements in all.
struct SendSegment {
  const float* acc = nullptr;
  const int32_t* index = nullptr;
  int64_t count = 0, at = 0;       // its elements (or room), and where they start among all the sends'
  const int64_t* limit = nullptr;  // fixed capacity: its count on the device (the first of `count`)
  Feedback fb;                     // its state (send_state)
  void* values = nullptr;
  FloatType value_type = FloatType::kFloat32;
};
void send_segments(const SendSegment* sends, int64_t n, int64_t total, cudaStream_t stream);

// A bucket's dense momentum steps (DGC's dense route): momentum_step of each gradient, in place,
// `total` elements in all.
struct MomentumSegment {
  void* grad = nullptr;  // read, and written with what is reduced
  FloatType grad_type = FloatType::kFloat32;
  Feedback fb;     // its momentum, factor, Nesterov and gradient scale
  int64_t at = 0;  // where its elements start among all the gradients'
};
void momentum_segments(const MomentumSegment* grads, int64_t n, int64_t total, cudaStream_t stream);

// A bucket's clipping factors (DGC's local gradient clipping): each gradient's norm, its sum of
// squares in squares.h's order (sum_of_squares's bits), and factor = (1 / norm) * limit where the
// norm is above the limit, else 1, rounded to float32. `tiles` square tiles in all, a double of scratch each.
struct ClipSegment {
  const void* grad = nullptr;
  FloatType grad_type = FloatType::kFloat32;
  int64_t numel = 0, tile_at = 0;  // its first square tile among all the gradients'
  double limit = 0.0;
  float* factor = nullptr;
};
void clip_segments(const ClipSegment* grads, int64_t n, int64_t tiles, double* tile_sums, cudaStream_t stream);

// A bucket's wire rows: wire_rows of each send (of [0, length)), `total` rows in all.
struct WireSegment {
  const void* values = nullptr;
  const int32_t* index = nullptr;
  int64_t value_bytes = 4, count = 0, buckets = 0;  // buckets: its markers, one a bucket of [0, length)
  int64_t at = 0;  // its first row among all the sends' rows (its own: count + its buckets' markers)
  uint8_t* rows = nullptr;
  const int64_t* limit = nullptr;  // fixed capacity: its count on the device (count: its room)
  int64_t* rows_count = nullptr;   // fixed capacity: where its number of rows is written
};
void wire_segments(const WireSegment* sends, int64_t n, int64_t total, cudaStream_t stream);

// ---- quantized.cu: a bucket's 1-/2-bit sends and the fixed segments of the DDP and FSDP wire
// (kernels/quantize.h), each in a fixed number of launches whatever its number of tensors.

// A bucket's quantized sends at fixed capacity: send_quantized of each tensor's first *limit
// selected (tiles.cuh's quantize_block: its bits), a block a tensor.
struct QuantizeSegment {
  const float* acc = nullptr;
  const int32_t* index = nullptr;
  const int64_t* limit = nullptr;  // its count, on the device
  Feedback fb;                     // its state (send_state)
  uint8_t* codes = nullptr;
  float* scales = nullptr;
};
void quantize_segments(const QuantizeSegment* sends, int64_t n, int bits, cudaStream_t stream);

// A bucket's fixed segments: every item of each (write_fixed_segment_item), `total` in all.
void fixed_segments(const FixedSegmentSend* sends, int64_t n, int64_t total, cudaStream_t stream);

// One rank's fixed segment of one tensor, among the gathered ones of a bucket.
struct SegmentRead {
  const uint8_t* segment = nullptr;
  int64_t room = 0, buckets = 0;
  int64_t bucket_at = 0;  // its first bucket among all the reads' buckets
  int64_t at = 0;         // its first entry among all the reads' entries (room each)
  int64_t place = 0;      // its tensor's first element in the outs' shared allocation
};
// starts[bucket_at + b] = the first entry of bucket b of each read (the exclusive sum of its bucket
// counts), a thread a read.
void segment_starts(const SegmentRead* reads, int64_t n, int bits, int64_t* starts, cudaStream_t stream);
// Entry e of all the reads' (`total`): values[e] its code's scale, places[e] its tensor's place plus
// its index; an entry at or past its segment's count (read on the device) -0.0 at its tensor's first
// place, which adds nothing to a sum.
void segment_entries(const SegmentRead* reads, int64_t n, int64_t total, int bits, const int64_t* starts, float* values,
                     int32_t* places, cudaStream_t stream);

// ---- sort.cu: the scan and sorts that csrc/torch/cuda.cpp takes from torch (cumsum, sort),
// for the TF binding. Each needs `scratch` device memory and returns how many bytes (at least
// 1); with scratch == nullptr it only returns them and launches nothing (cub's convention).

// tile_offsets[t] = tile_counts[0] + ... + tile_counts[t - 1] for t <= tiles: tile_counts has
// tiles + 1 entries, the last 0, so that tile_offsets[tiles] is the number of candidates.
size_t candidate_offsets(const int32_t* tile_counts, int64_t tiles, int64_t* tile_offsets, void* scratch,
                         cudaStream_t stream);

// A stable sort of the indices: sparse_unpack_sorted's sorted_index and order.
size_t sort_index(const int32_t* index, int64_t count, int32_t* sorted_index, int64_t* order, void* scratch,
                  cudaStream_t stream);

// out = in[0, n) sorted ascending.
size_t sort_ascending(const int32_t* in, int64_t n, int32_t* out, void* scratch, cudaStream_t stream);

// cpu::select_top out of place: the min(count, k) candidates of largest magnitude (ties: lower
// position first) to acc_top / index_top, in input order. count < 2^31 (int32 positions).
size_t select_top(const float* acc, const int32_t* index, int64_t count, int64_t k, float* acc_top, int32_t* index_top,
                  void* scratch, cudaStream_t stream);

}  // namespace cuda
}  // namespace sparsecomm
