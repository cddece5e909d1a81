// CPU launchers for threshold / top-k selection with error feedback (feedback.h, sample.h).
#include <algorithm>
#include <cmath>

#include "launchers.h"

namespace sparsecomm {
namespace cpu {

template <typename T>
float sample_threshold(const T* grad, const Feedback& fb, int64_t numel, const SamplePlan& plan) {
  if (numel == 0 || plan.count == 0) return INFINITY;
  std::vector<float> sample(plan.count);
  float u;
  for (int64_t j = 0; j < plan.count; ++j)
    sample[j] = magnitude(accumulated(grad, fb, plan.offset + j * plan.stride, &u));
  auto nth = sample.begin() + (plan.rank - 1);
  std::nth_element(sample.begin(), nth, sample.end(), std::greater<float>());
  return *nth;
}

namespace {

// Blocks of 64 elements: the accumulate loop and the any-selected flag vectorize; the rare
// blocks with a candidate are walked again to append it.
constexpr int64_t kBlock = 64;

template <typename T, bool kResidualIn, bool kMomentum>
void accumulate_blocks(const T* grad, const Feedback& fb, int64_t numel, float threshold,
                       std::vector<float>& acc_out, std::vector<int32_t>& index_out) {
  float acc[kBlock];
  for (int64_t first = 0; first < numel; first += kBlock) {
    const int64_t n = std::min(kBlock, numel - first);
    const T* g = grad + first;
    int any = 0;
    for (int64_t j = 0; j < n; ++j) {
      float u = to_float(g[j]);
      if (kMomentum) {
        u = fb.momentum * fb.momentum_in[first + j] + u;
        if (fb.momentum_out) fb.momentum_out[first + j] = u;
      }
      const float a = kResidualIn ? fb.residual_in[first + j] + u : u;
      if (fb.residual_out) fb.residual_out[first + j] = a;
      acc[j] = a;
      any |= int(selected(a, threshold));
    }
    if (!any) continue;
    for (int64_t j = 0; j < n; ++j) {
      if (selected(acc[j], threshold)) {
        acc_out.push_back(acc[j]);
        index_out.push_back(int32_t(first + j));
      }
    }
  }
}

}  // namespace

template <typename T>
void accumulate_candidates(const T* grad, const Feedback& fb, int64_t numel, float threshold,
                           std::vector<float>& acc, std::vector<int32_t>& index) {
  // The state layout is fixed per call: specialize the hot loop on it.
  if (fb.residual_in && fb.momentum_in) accumulate_blocks<T, true, true>(grad, fb, numel, threshold, acc, index);
  else if (fb.residual_in) accumulate_blocks<T, true, false>(grad, fb, numel, threshold, acc, index);
  else if (fb.momentum_in) accumulate_blocks<T, false, true>(grad, fb, numel, threshold, acc, index);
  else accumulate_blocks<T, false, false>(grad, fb, numel, threshold, acc, index);
}

int64_t select_top(float* acc, int32_t* index, int64_t count, int64_t k) {
  if (k >= count) return count;
  if (k <= 0) return 0;
  std::vector<int64_t> order(count);
  for (int64_t j = 0; j < count; ++j) order[j] = j;
  // Larger magnitude first; equal magnitudes by lower index (candidates are in index order).
  auto before = [&](int64_t a, int64_t b) {
    const float ma = magnitude(acc[a]), mb = magnitude(acc[b]);
    return ma > mb || (ma == mb && a < b);
  };
  std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), before);
  std::sort(order.begin(), order.begin() + k);  // back to index order
  for (int64_t j = 0; j < k; ++j) {  // order[j] >= j: compaction in place is safe
    acc[j] = acc[order[j]];
    index[j] = index[order[j]];
  }
  return k;
}

template <typename T>
void send_selected(const float* acc, const int32_t* index, int64_t count, const Feedback& fb, T* values) {
  for (int64_t j = 0; j < count; ++j) values[j] = send<T>(fb, index[j], acc[j]);
}

template <typename T>
void sparse_unpack(const T* values, const int32_t* index, int64_t count, float scale, int64_t numel, T* dense) {
  std::vector<float> sum(numel, 0.0f);
  for (int64_t j = 0; j < count; ++j) sum[index[j]] += to_float(values[j]);
  for (int64_t i = 0; i < numel; ++i) dense[i] = from_float<T>(scale * sum[i]);
}

template <>
void sparse_unpack<float>(const float* values, const int32_t* index, int64_t count, float scale, int64_t numel,
                          float* dense) {
  std::fill(dense, dense + numel, 0.0f);
  for (int64_t j = 0; j < count; ++j) dense[index[j]] += values[j];
  if (scale != 1.0f)
    for (int64_t i = 0; i < numel; ++i) dense[i] *= scale;
}

#define SC_INSTANTIATE(T)                                                                                     \
  template float sample_threshold<T>(const T*, const Feedback&, int64_t, const SamplePlan&);                  \
  template void accumulate_candidates<T>(const T*, const Feedback&, int64_t, float, std::vector<float>&,       \
                                         std::vector<int32_t>&);                                             \
  template void send_selected<T>(const float*, const int32_t*, int64_t, const Feedback&, T*);                  \
  template void sparse_unpack<T>(const T*, const int32_t*, int64_t, float, int64_t, T*);
SC_INSTANTIATE(float)
SC_INSTANTIATE(half16)
SC_INSTANTIATE(bfloat16)
#undef SC_INSTANTIATE

}  // namespace cpu
}  // namespace sparsecomm
