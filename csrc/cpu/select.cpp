// CPU launchers for threshold / top-k selection with error feedback (feedback.h, sample.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "launchers.h"
#include "parallel.h"
#include "scatter.h"
#include "stream.h"

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace sparsecomm {
namespace cpu {

namespace {

// The rank-th largest (1-based) magnitude of acc[0, count), and how many are strictly larger:
// the threshold of a sample, the k-th of top-k's candidates. Magnitudes are non-negative floats
// (NaN as +inf), which order as their bits: a histogram of the top 16 bits finds the bucket that
// holds the rank-th, and only that bucket (a small part of the values, unless they cluster) is
// selected exactly (figures for this and the constants below: docs/kernels.md, "CPU choices").
// A few among many are found by filtering instead, and a few thousand values by one nth_element.
struct Kth {
  float value;
  int64_t above;
};

// A few thousand values or fewer are selected directly: clearing and walking the 32k-bucket
// histogram alone would cost most of a small tensor's threshold.
constexpr int64_t kDirectSelection = 4096;

// The rank-th of a few among many (a tensor sampled whole has rank = ratio * count, at most about
// 256) is found by filtering: a bucket of `capacity` values keeps every value above a bound,
// which rises each time the bucket fills and is cut to its rank largest. In no particular order
// few values pass (about rank * ln(count / capacity)), and one vectorized compare per block of
// kFilterBlock skips the rest. Where it does not pay, the histogram or direct path runs: rank
// over count / 256 above kFilterMaxDense values, or values in ascending order, where each one
// passes (the filter gives up after kFilterGiveUp bucketfuls).
constexpr int64_t kFilterMinCapacity = 256;
constexpr int64_t kFilterMaxDense = 4 * kDirectSelection;
constexpr int64_t kFilterBlock = 16;
constexpr int64_t kFilterGiveUp = 8;

int64_t filter_capacity(int64_t count, int64_t rank) {
  const int64_t capacity = std::max(4 * rank, kFilterMinCapacity);
  const bool pays = 2 * capacity <= count && (count <= kFilterMaxDense || 256 * rank <= count);
  return pays ? capacity : 0;
}

// Fills `bucket` with values among which the rank-th largest of acc[0, count) is, and every
// value above it; false if it gave up (the values came in an order that let most of them pass).
bool filtered(const float* acc, int64_t count, int64_t rank, int64_t capacity, std::vector<float>& bucket) {
  bucket.resize(capacity + kFilterBlock);
  float* b = bucket.data();
  for (int64_t j = 0; j < capacity; ++j) b[j] = magnitude(acc[j]);
  int64_t size = capacity, passed = 0;
  float bound = 0.0f;
  auto cut = [&] {  // the rank largest stay; the bound is the least of them
    std::nth_element(b, b + (rank - 1), b + size, std::greater<float>());
    bound = b[rank - 1];
    passed += size - rank;
    size = rank;
  };
  cut();
  int64_t j = capacity;
  for (; j + kFilterBlock <= count; j += kFilterBlock) {
    // The block's largest |value|, on the bits (an integer max: the loop vectorizes). A NaN's
    // bits are above +inf's, so a block with one is never skipped: the append compares magnitudes.
    uint32_t top = 0;
    for (int64_t q = 0; q < kFilterBlock; ++q) top = std::max(top, float_bits(acc[j + q]) & 0x7fffffffu);
    if (top <= float_bits(bound)) continue;
    for (int64_t q = 0; q < kFilterBlock; ++q) {  // branch-free append of those above the bound
      b[size] = magnitude(acc[j + q]);
      size += b[size] > bound;
    }
    if (size > capacity) {
      cut();
      if (passed > kFilterGiveUp * capacity) return false;
    }
  }
  for (; j < count; ++j) {
    b[size] = magnitude(acc[j]);
    size += b[size] > bound;
  }
  bucket.resize(size);
  return true;
}

Kth kth_largest_magnitude(const float* acc, int64_t count, int64_t rank) {
  static thread_local std::vector<float> bucket;  // the values the rank-th is among
  int64_t above = 0;                              // how many values are above all of those
  const int64_t capacity = filter_capacity(count, rank);
  // The filter, where it pays and does not give up, leaves the rank-th and every value above it
  // in the bucket; otherwise the bucket takes every value (a few thousand), or the histogram's
  // bucket that holds the rank-th.
  if (capacity == 0 || !filtered(acc, count, rank, capacity, bucket)) {
    bucket.clear();
    if (count <= kDirectSelection) {
      for (int64_t j = 0; j < count; ++j) bucket.push_back(magnitude(acc[j]));
    } else {
      constexpr int kShift = 16;
      constexpr uint32_t kBuckets = (0x7f800000u >> kShift) + 1;  // up to +inf's bucket
      static thread_local std::vector<uint32_t> histogram;
      histogram.assign(kBuckets, 0);
      for (int64_t j = 0; j < count; ++j) ++histogram[float_bits(magnitude(acc[j])) >> kShift];
      uint32_t b = kBuckets;
      while (above + histogram[--b] < rank) above += histogram[b];
      for (int64_t j = 0; j < count; ++j) {
        const float m = magnitude(acc[j]);
        if (float_bits(m) >> kShift == b) bucket.push_back(m);
      }
    }
  }
  const int64_t rank_in_bucket = rank - above;
  std::nth_element(bucket.begin(), bucket.begin() + (rank_in_bucket - 1), bucket.end(), std::greater<float>());
  const float kth = bucket[rank_in_bucket - 1];
  for (int64_t j = 0; j < rank_in_bucket - 1; ++j) above += bucket[j] > kth;  // the rest are <= kth
  kept_capacity(bucket);
  return {kth, above};
}

}  // namespace

// |acc| (feedback.h's accumulated, the same operations in the same order) of the n elements from
// `first` into out. The state is tested once, not per element, so that each loop vectorizes. A
// tensor under about min_hits / ratio elements is sampled whole (sample_count): gathered element
// by element, that would cost more than selecting its threshold.
template <typename T>
void magnitudes_of_run(const T* grad, const Feedback& fb, int64_t first, int64_t n, float* out) {
  const T* g = grad + first;
  const float* r = fb.residual_in ? fb.residual_in + first : nullptr;
  const float* u = fb.momentum_in ? fb.momentum_in + first : nullptr;
  const float m = fb.momentum;
  if (fb.grad_scale || fb.nesterov) {  // (DGC's clipping or Nesterov: element by element, as accumulated() reads it)
    float unused;
    for (int64_t q = 0; q < n; ++q) out[q] = magnitude(accumulated(grad, fb, first + q, &unused));
  } else if (r && u) {
    for (int64_t q = 0; q < n; ++q) out[q] = magnitude(r[q] + (m * u[q] + to_float(g[q])));
  } else if (u) {
    for (int64_t q = 0; q < n; ++q) out[q] = magnitude(m * u[q] + to_float(g[q]));
  } else if (r) {
    for (int64_t q = 0; q < n; ++q) out[q] = magnitude(r[q] + to_float(g[q]));
  } else {
    for (int64_t q = 0; q < n; ++q) out[q] = magnitude(to_float(g[q]));
  }
}

template <typename T>
float sample_threshold(const T* grad, const Feedback& fb, int64_t numel, const SamplePlan& plan) {
  if (numel == 0 || plan.count == 0) return INFINITY;
  static thread_local std::vector<float> this_thread_sample;
  auto& sample = this_thread_sample;  // (inside the parallel loop the thread_local name would be the worker's)
  sample.resize(plan.count);
  // The runs are scattered over the tensor (a cache miss each): the threads' misses overlap.
  const int threads = plan.count >= kParallelMinScattered ? pass_threads(kParallelMinElements) : 1;
  for_chunks(plan.runs, threads, 1, [&](int, int64_t begin, int64_t end) {
    float* out = sample.data() + begin * plan.run;
    if (plan.stride == plan.run) {  // the runs touch: one contiguous stretch
      magnitudes_of_run(grad, fb, plan.offset + begin * plan.stride, (end - begin) * plan.run, out);
      return;
    }
    float u;
    for (int64_t r = begin; r < end; ++r) {  // nested loops: no division per sample
      const int64_t first = plan.offset + r * plan.stride;
      for (int64_t q = 0; q < plan.run; ++q) *out++ = magnitude(accumulated(grad, fb, first + q, &u));
    }
  });
  const float threshold = kth_largest_magnitude(sample.data(), plan.count, plan.rank).value;
  kept_capacity(sample);
  return threshold;
}

namespace {

// Blocks of 64 elements: the accumulate loop and the any-selected flag vectorize; the blocks
// with a candidate are visited again, candidate by candidate.
constexpr int64_t kBlock = 64;

// The (acc, index) lists a pass appends to, a block at a time. Room for a whole block is made
// before it, so each candidate is two plain stores. (A push_back per candidate, or a resize per
// block, which calls out of the loop, was most of the candidates' cost at densities of 1-10%.)
// finish() cuts the lists to what was appended.
class CandidateLists {
 public:
  CandidateLists(std::vector<float>& acc, std::vector<int32_t>& index) : acc_(acc), index_(index), size_(acc.size()) {}

  // Appends the block's candidates, the set bits of mask: acc[j] at index first + j.
  void append(const float* acc, uint64_t mask, int64_t first) {
    if (size_ + kBlock > acc_.size()) {
      acc_.resize(std::max<size_t>(2 * acc_.size(), size_ + kBlock));
      index_.resize(acc_.size());
    }
    float* a = acc_.data() + size_;
    int32_t* index = index_.data() + size_;
    for (; mask; mask &= mask - 1) {
      const int j = __builtin_ctzll(mask);
      *a++ = acc[j];
      *index++ = int32_t(first + j);
    }
    size_ = a - acc_.data();
  }

  void finish() {
    acc_.resize(size_);
    index_.resize(size_);
  }

 private:
  std::vector<float>& acc_;
  std::vector<int32_t>& index_;
  size_t size_;
};

template <typename T, bool kResidual, bool kMomentum, bool kNesterov = false>
void accumulate_blocks(const T* grad, const Feedback& fb, int64_t begin, int64_t end, float threshold,
                       CandidateLists& out) {
  const float* residual_in = fb.residual_in;
  float* residual_out = fb.residual_out;
  const float* momentum_in = fb.momentum_in;
  float* momentum_out = fb.momentum_out;
  const float m = fb.momentum;
  const bool scaled_grad = fb.grad_scale != nullptr;
  const float s = scaled_grad ? *fb.grad_scale : 1.0f;
  float acc[kBlock];
  for (int64_t first = begin; first < end; first += kBlock) {
    const int64_t n = std::min(kBlock, end - first);
    int any = 0;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = first + j;
      float g = to_float(grad[i]);
      if (scaled_grad) g = scaled<T>(g, s);
      float u = g;
      if (kMomentum) {
        u = kNesterov ? m * (momentum_in[i] + g) : m * momentum_in[i] + g;
        momentum_out[i] = u;
      }
      float a = kResidual ? residual_in[i] + u : u;
      if (kNesterov) a = a + g;
      if (kResidual) residual_out[i] = a;
      acc[j] = a;
      any |= int(selected(a, threshold));
    }
    if (!any) continue;
    // The block's candidates as bits (branch-free, from L1), then one step per candidate: no
    // mispredicted branch per element when many blocks hold one (densities around 1%).
    uint64_t mask = 0;
    for (int64_t j = 0; j < n; ++j) mask |= uint64_t(selected(acc[j], threshold)) << j;
    out.append(acc, mask, first);
  }
}

#ifdef __AVX2__
// The same pass for a float32 gradient, 8 lanes at a time: each compare gives its lanes'
// candidate bits directly (movemask), with no second look at the block and no copy of it
// (a candidate's acc is read back from the state just written, or the gradient: in L1).
// The same operations in the same order as accumulated() and selected(): the same bits.
template <bool kResidual, bool kMomentum>
void accumulate_blocks_avx2(const float* grad, const Feedback& fb, int64_t begin, int64_t end, float threshold,
                            CandidateLists& out) {
  const __m256 t = _mm256_set1_ps(threshold), m = _mm256_set1_ps(fb.momentum);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  // g * 1 is g exactly (NaN, infinities and -0 included): one loop with or without a scale.
  const __m256 s = _mm256_set1_ps(fb.grad_scale ? *fb.grad_scale : 1.0f);
  const float* acc = kResidual ? fb.residual_out : kMomentum ? fb.momentum_out : grad;  // where acc lands
  int64_t first = begin;
  for (; first + kBlock <= end; first += kBlock) {
    uint64_t mask = 0;
    for (int v = 0; v < kBlock / 8; ++v) {
      const int64_t i = first + 8 * v;
      __m256 u = _mm256_mul_ps(_mm256_loadu_ps(grad + i), s);
      if (kMomentum) {
        u = _mm256_add_ps(_mm256_mul_ps(m, _mm256_loadu_ps(fb.momentum_in + i)), u);
        _mm256_storeu_ps(fb.momentum_out + i, u);
      }
      const __m256 a = kResidual ? _mm256_add_ps(_mm256_loadu_ps(fb.residual_in + i), u) : u;
      if (kResidual) _mm256_storeu_ps(fb.residual_out + i, a);
      // selected(): not |a| < t, which holds for a NaN a too (unordered)
      const __m256 picked = _mm256_cmp_ps(_mm256_andnot_ps(sign, a), t, _CMP_NLT_UQ);
      mask |= uint64_t(uint32_t(_mm256_movemask_ps(picked))) << (8 * v);
    }
    if (mask) out.append(acc + first, mask, first);
  }
  accumulate_blocks<float, kResidual, kMomentum>(grad, fb, first, end, threshold, out);  // the tail
}
#endif

}  // namespace

template <typename T>
void accumulate_candidates(const T* grad, const Feedback& fb, int64_t numel, float threshold, std::vector<float>& acc,
                           std::vector<int32_t>& index) {
  // The state layout is fixed per call: specialize the hot loop on it. A state is read and
  // written (in place, or in -> out), or absent.
  const bool residual = fb.residual_in && fb.residual_out, momentum = fb.momentum_in && fb.momentum_out;
  if ((fb.residual_in || fb.residual_out) != residual || (fb.momentum_in || fb.momentum_out) != momentum)
    throw std::invalid_argument("accumulate_candidates: residual and momentum need both an input and an output");
  // The candidates' acc is read back from the state. (An empty tensor's state may have no data.)
  if (fb.grad_scale && !residual && !momentum && numel > 0)
    throw std::invalid_argument("accumulate_candidates: a grad_scale needs a residual or a momentum");
  // Nesterov's acc is not u: it lands in the residual only.
  if (fb.nesterov && !(residual && momentum) && numel > 0)
    throw std::invalid_argument("accumulate_candidates: Nesterov momentum needs a residual and a momentum");
  auto pass = residual && momentum ? accumulate_blocks<T, true, true>
              : residual           ? accumulate_blocks<T, true, false>
              : momentum           ? accumulate_blocks<T, false, true>
                                   : accumulate_blocks<T, false, false>;
#ifdef __AVX2__
  if constexpr (std::is_same_v<T, float>)
    pass = residual && momentum ? accumulate_blocks_avx2<true, true>
           : residual           ? accumulate_blocks_avx2<true, false>
           : momentum           ? accumulate_blocks_avx2<false, true>
                                : accumulate_blocks_avx2<false, false>;
#endif
  if (fb.nesterov) pass = accumulate_blocks<T, true, true, true>;  // (no AVX2 variant: an option, not the default)
  const int chunks = pass_threads(numel);
  if (chunks == 1) {
    CandidateLists out(acc, index);
    pass(grad, fb, 0, numel, threshold, out);
    return out.finish();
  }
  // Each chunk collects its own candidates; concatenated in chunk order they stay in index order.
  // A chunk's lists sit on their own cache line: two threads appending to neighbouring vector
  // headers would bounce that line between cores on every candidate (false sharing). The lists
  // are this thread's, reused from call to call.
  struct alignas(64) Lists {
    std::vector<float> acc;
    std::vector<int32_t> index;
  };
  static thread_local std::vector<Lists> this_thread_lists;
  auto& lists = this_thread_lists;  // (inside the parallel loop the thread_local name would be the worker's)
  if (int(lists.size()) < chunks) lists.resize(chunks);
  for_chunks(numel, chunks, kBlock, [&](int c, int64_t begin, int64_t end) {
    lists[c].acc.clear();
    lists[c].index.clear();
    CandidateLists out(lists[c].acc, lists[c].index);
    pass(grad, fb, begin, end, threshold, out);
    out.finish();
  });
  for (int c = 0; c < chunks; ++c) {
    acc.insert(acc.end(), lists[c].acc.begin(), lists[c].acc.end());
    index.insert(index.end(), lists[c].index.begin(), lists[c].index.end());
    kept_capacity(lists[c].acc);
    kept_capacity(lists[c].index);
  }
}

int64_t select_top(float* acc, int32_t* index, int64_t count, int64_t k) {
  if (k >= count) return count;
  if (k <= 0) return 0;
  // One compaction in index order: every candidate above the k-th largest magnitude, and the
  // ones equal to it while they are needed (ties: lower index first).
  const Kth kth = kth_largest_magnitude(acc, count, k);
  int64_t ties = k - kth.above;
  int64_t kept = 0;
  for (int64_t j = 0; j < count; ++j) {  // branch-free (a kept candidate is a coin flip); kept <= j
    const float m = magnitude(acc[j]);
    const bool tie = m == kth.value, take = (m > kth.value) | (tie & (ties > 0));
    ties -= tie & take;
    acc[kept] = acc[j];
    index[kept] = index[j];
    kept += take;
  }
  return kept;
}

template <typename T>
void send_selected(const float* acc, const int32_t* index, int64_t count, const Feedback& fb, T* values) {
  // Each element writes its own state line (scattered, a cache miss each): the prefetch ahead
  // (scatter.h) and several threads keep many misses in flight. Indices are distinct, so the
  // chunks never share an element.
  for_chunks(count, count >= kParallelMinScattered ? pass_threads(kParallelMinElements) : 1, 16,
             [&](int, int64_t begin, int64_t end) {
               for (int64_t j = begin; j < end; ++j) {
                 if (j + kPrefetchAhead < end) prefetch_sent_state(fb, index[j + kPrefetchAhead]);
                 values[j] = send<T>(fb, index[j], acc[j]);
               }
             });
}

namespace {

// Runs of strictly ascending indices: each run's [first, end) positions in the input.
struct Runs {
  std::vector<int64_t> first, end;
};

// Adds into dense[lo, hi) every pair of the runs whose index is in [lo, hi), block by block of
// the output: the runs' pairs that land in the block are summed, run after run, into a float32
// buffer in L1 (so each index's contributions add in input order, from +0: a lone -0 lands as
// +0), scaled and rounded once into a zeroed staging block, and the block is written out
// (streamed if `stream`: stream.h). Each output element is written once, the old contents are
// not read when streamed, and a pair costs a few L1 accesses: no search over the run heads.
template <typename T>
void merge_range(const T* values, const int32_t* index, const Runs& runs, float scale, int64_t lo, int64_t hi, T* dense,
                 bool stream) {
  constexpr int64_t kBlock = 1 << 12;  // 16 KB of float32: both buffers stay in L1
  float sum[kBlock];
  T staged[kBlock];
  std::fill(sum, sum + kBlock, 0.0f);
  const size_t count = runs.first.size();
  std::vector<int64_t> next(count), stop(count);
  for (size_t r = 0; r < count; ++r) {  // each run's pairs in [lo, hi)
    const int32_t* first = index + runs.first[r];
    const int32_t* end = index + runs.end[r];
    next[r] = std::lower_bound(first, end, lo) - index;
    stop[r] = std::lower_bound(index + next[r], end, hi) - index;
  }
  std::vector<int64_t> block_stop(count);
  for (int64_t block = lo; block < hi; block += kBlock) {
    const int64_t block_end = std::min(hi, block + kBlock);
    for (size_t r = 0; r < count; ++r) {
      int64_t j = next[r];
      for (; j < stop[r] && index[j] < block_end; ++j) sum[index[j] - block] += to_float(values[j]);
      block_stop[r] = j;
    }
    std::fill(staged, staged + (block_end - block), from_float<T>(0.0f));
    for (size_t r = 0; r < count; ++r)  // a duplicate writes the same value again
      for (int64_t j = next[r]; j < block_stop[r]; ++j)
        staged[index[j] - block] = from_float<T>(scale * sum[index[j] - block]);
    for (size_t r = 0; r < count; ++r)  // the sums back to zero for the next block
      for (; next[r] < block_stop[r]; ++next[r]) sum[index[next[r]] - block] = 0.0f;
    copy_streaming(dense + block, staged, (block_end - block) * int64_t(sizeof(T)), stream);
  }
  fence_streaming();
}

// Above this many ascending runs (inputs in no useful order), walking every run in every block
// costs more than summing in a dense scratch buffer; below it the merge is faster.
constexpr size_t kMaxMergedRuns = 1024;

// For inputs in no useful order: duplicates summed in a per-thread float32 scratch that is all
// zero between calls (grown once), after a write pass that zeroes the output.
template <typename T>
void scatter_through_scratch(const T* values, const int32_t* index, int64_t count, float scale, int64_t numel,
                             T* dense) {
  static thread_local std::vector<float> scratch;
  if (int64_t(scratch.size()) < numel) scratch.assign(numel, 0.0f);
  float* sum = scratch.data();
  for_chunks(numel, pass_threads(numel), 64, [&](int, int64_t lo, int64_t hi) {
    // +0 is all zero bits in every dtype
    zero_streaming(dense + lo, (hi - lo) * int64_t(sizeof(T)), worth_streaming(numel * int64_t(sizeof(T))));
    fence_streaming();
  });
  for (int64_t j = 0; j < count; ++j) sum[index[j]] += to_float(values[j]);
  for (int64_t j = 0; j < count; ++j) dense[index[j]] = from_float<T>(scale * sum[index[j]]);  // again for a duplicate
  for (int64_t j = 0; j < count; ++j) sum[index[j]] = 0.0f;
}

}  // namespace

template <typename T>
void sparse_unpack(const T* values, const int32_t* index, int64_t count, float scale, int64_t numel, T* dense) {
  // The values come as strictly ascending runs (every rank's selection is in index order;
  // gathered, they are one run per rank). One pass over the output (it may be the gradient
  // buffer itself: no allocation) zeroes it and merges the runs into it block by block.
  Runs runs;
  runs.first.push_back(0);
  for (int64_t j = 1; j < count; ++j) {
    if (index[j] > index[j - 1]) continue;
    if (runs.first.size() == kMaxMergedRuns) return scatter_through_scratch(values, index, count, scale, numel, dense);
    runs.end.push_back(j);
    runs.first.push_back(j);
  }
  runs.end.push_back(count);
  for_chunks(numel, pass_threads(numel), 64, [&](int, int64_t lo, int64_t hi) {
    merge_range(values, index, runs, scale, lo, hi, dense, worth_streaming(numel * int64_t(sizeof(T))));
  });
}

template <typename T>
void accumulate(const T* grad, const Feedback& fb, int64_t numel) {
  // The candidates' vectorized pass, with nothing above the threshold but NaNs; their lists are
  // this thread's and dropped.
  static thread_local std::vector<float> acc;
  static thread_local std::vector<int32_t> index;
  acc.clear();
  index.clear();
  accumulate_candidates(grad, fb, numel, std::numeric_limits<float>::infinity(), acc, index);
  kept_capacity(acc);
  kept_capacity(index);
}

template <typename T>
void momentum_step(const T* grad, const Feedback& fb, int64_t numel, T* out) {
  for_chunks(numel, pass_threads(numel), 64, [&](int, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) momentum_element(grad, fb, i, out);
  });
}

namespace {

// kGroup consecutive elements as floats. float16 goes through F16C where there is one (to_float
// decodes bit by bit, much slower; only a NaN's payload may differ, and a sum with a NaN is NaN
// either way).
constexpr int kGroup = 16;

template <typename T>
inline void group_as_floats(const T* x, float* f) {
#if defined(__F16C__)
  if constexpr (std::is_same_v<T, half16>) {
    for (int j = 0; j < kGroup; j += 8)
      _mm256_storeu_ps(f + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + j))));
    return;
  }
#endif
  for (int j = 0; j < kGroup; ++j) f[j] = to_float(x[j]);
}

// A whole tile's lanes, kGroup lanes at a time down all its rows: each lane still adds its rows
// in turn (squares.h's order), with its sum held in a register instead of memory.
template <typename T>
void whole_tile_lanes(const T* tile, double* lanes) {
  constexpr int rows = int(kSquareTile / kSquareLanes);
  for (int j0 = 0; j0 < kSquareLanes; j0 += kGroup) {
    double acc[kGroup] = {};
    for (int r = 0; r < rows; ++r) {
      float f[kGroup];
      group_as_floats(tile + r * kSquareLanes + j0, f);
      for (int j = 0; j < kGroup; ++j) acc[j] += square(f[j]);
    }
    for (int j = 0; j < kGroup; ++j) lanes[j0 + j] = acc[j];
  }
}

}  // namespace

template <typename T>
void sum_of_squares(const T* x, int64_t numel, double* tile_sums, double* out) {
  const int64_t tiles = square_tiles(numel);
  for_chunks(tiles, pass_threads(numel), 1, [&](int, int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const T* tile = x + t * kSquareTile;
      const int64_t n = std::min(kSquareTile, numel - t * kSquareTile);
      double lanes[kSquareLanes] = {};
      if (n == kSquareTile) {
        whole_tile_lanes(tile, lanes);
      } else {  // the last tile: row by row
        for (int64_t i = 0; i < n; ++i) lanes[i % kSquareLanes] += square(to_float(tile[i]));
      }
      tile_sums[t] = pairwise_lanes(lanes);
    }
  });
  double lanes[kSquareLanes] = {};
  for (int64_t t = 0; t < tiles; ++t) lanes[t % kSquareLanes] += tile_sums[t];
  *out = pairwise_lanes(lanes);
}

namespace {

// A row's parts copied with sizes known at compile time: plain loads and stores, no memcpy call.
// One pass over the elements, a marker row written before each bucket's.
template <int64_t kValueBytes>
bool rows_from_columns(const uint8_t* values, const int32_t* index, int64_t count, int64_t start, int64_t length,
                       uint8_t* rows) {
  constexpr int64_t width = kWireOffsetBytes + kValueBytes;
  const int64_t first = start / kWireBucket, last = first + wire_buckets(start, length), end = start + length;
  int64_t j = 0, previous = start - 1;
  for (int64_t b = first; b < last; ++b) {
    const uint16_t marker[2] = {kWireMarker, uint16_t(b)};
    std::memset(rows, 0, width);
    std::memcpy(rows, marker, sizeof(marker));
    rows += width;
    const int64_t bucket_end = std::min(end, (b + 1) * kWireBucket);
    for (; j < count && index[j] < bucket_end; ++j) {
      if (index[j] <= previous) return false;
      previous = index[j];
      const uint16_t offset = uint16_t(index[j] - b * kWireBucket);
      std::memcpy(rows, &offset, kWireOffsetBytes);
      std::memcpy(rows + kWireOffsetBytes, values + j * kValueBytes, kValueBytes);
      rows += width;
    }
  }
  return j == count;
}

template <int64_t kValueBytes>
int64_t columns_from_rows(const uint8_t* rows, int64_t count, uint8_t* values, int32_t* index) {
  constexpr int64_t width = kWireOffsetBytes + kValueBytes;
  int64_t base = -1, n = 0;
  for (int64_t j = 0; j < count; ++j, rows += width) {
    uint16_t offset;
    std::memcpy(&offset, rows, kWireOffsetBytes);
    if (offset == kWireMarker) {
      uint16_t bucket;
      std::memcpy(&bucket, rows + kWireOffsetBytes, sizeof(bucket));
      base = int64_t(bucket) * kWireBucket;
      continue;
    }
    if (base < 0 || base + offset > std::numeric_limits<int32_t>::max()) return -1;
    index[n] = int32_t(base + offset);
    std::memcpy(values + n * kValueBytes, rows + kWireOffsetBytes, kValueBytes);
    ++n;
  }
  return n;
}

}  // namespace

bool wire_rows(const void* values, int64_t value_bytes, const int32_t* index, int64_t count, int64_t start,
               int64_t length, uint8_t* rows) {
  const auto* v = static_cast<const uint8_t*>(values);
  return value_bytes == 2 ? rows_from_columns<2>(v, index, count, start, length, rows)
                          : rows_from_columns<4>(v, index, count, start, length, rows);
}

int64_t wire_columns(const uint8_t* rows, int64_t count, int64_t value_bytes, void* values, int32_t* index) {
  auto* v = static_cast<uint8_t*>(values);
  return value_bytes == 2 ? columns_from_rows<2>(rows, count, v, index) : columns_from_rows<4>(rows, count, v, index);
}

void random_k_indices(const Permutation& perm, int64_t k, int32_t* out) {
  for (int64_t j = 0; j < k; ++j) out[j] = int32_t(perm(j));
  std::sort(out, out + k);
}

#define SC_INSTANTIATE(T)                                                                                \
  template float sample_threshold<T>(const T*, const Feedback&, int64_t, const SamplePlan&);             \
  template void accumulate_candidates<T>(const T*, const Feedback&, int64_t, float, std::vector<float>&, \
                                         std::vector<int32_t>&);                                         \
  template void send_selected<T>(const float*, const int32_t*, int64_t, const Feedback&, T*);            \
  template void sparse_unpack<T>(const T*, const int32_t*, int64_t, float, int64_t, T*);                 \
  template void accumulate<T>(const T*, const Feedback&, int64_t);                                       \
  template void momentum_step<T>(const T*, const Feedback&, int64_t, T*);                                \
  template void sum_of_squares<T>(const T*, int64_t, double*, double*);
SC_FOR_FLOAT_TYPES(SC_INSTANTIATE)
#undef SC_INSTANTIATE

}  // namespace cpu
}  // namespace sparsecomm
