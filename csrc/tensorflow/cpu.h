// The CPU device policy of the TF op kernels (common.h lists its members): csrc/cpu's
// launchers, on the host.
#pragma once
#include <algorithm>
#include <utility>
#include <vector>

#include "../cpu/launchers.h"
#include "common.h"

namespace sparsecomm {
namespace tf_binding {

class CpuDevice {
 public:
  explicit CpuDevice(OpKernelContext* c) : c_(c) {}

  absl::Status check_index(const Tensor& index, int64_t numel, const char* name) const {
    return tf_binding::check_index(index, numel, name);
  }
  absl::Status copy(const float* from, int64_t n, float* to) const {
    std::copy(from, from + n, to);
    return absl::OkStatus();
  }

  // The launchers, as they are.
#define SC_CPU_LAUNCHER(name)             \
  template <typename... Args>             \
  absl::Status name(Args... args) const { \
    cpu::name(args...);                   \
    return absl::OkStatus();              \
  }
  SC_FORWARDED_LAUNCHERS(SC_CPU_LAUNCHER)
#undef SC_CPU_LAUNCHER

  // The threshold is computed on the host (the GPU's stays on the device).
  template <typename T>
  absl::Status sample_threshold(const Tensor& grad, const Feedback& fb, const SamplePlan& plan, Tensor* out) const {
    out->scalar<float>()() = cpu::sample_threshold(raw<T>(grad), fb, grad.NumElements(), plan);
    return absl::OkStatus();
  }

  // One pass that appends the candidates to this thread's reused lists (the GPU counts first
  // instead; cpu::kept_capacity says why they are reused).
  template <typename T>
  absl::Status accumulate_candidates(const Tensor& grad, const Feedback& fb, const Tensor& threshold) const {
    auto [acc, index] = candidates<T>(grad, fb, threshold.flat<float>()(0));
    return output_kept(acc, index, int64_t(acc.size()));
  }

  // cpu::select_top works in place: on copies, the inputs being read-only (the GPU sorts).
  absl::Status select_top(const Tensor& acc, const Tensor& index, int64_t k) const {
    std::vector<float> a(acc.flat<float>().data(), acc.flat<float>().data() + acc.NumElements());
    std::vector<int32_t> i(index.flat<int32_t>().data(), index.flat<int32_t>().data() + index.NumElements());
    const int64_t kept = cpu::select_top(a.data(), i.data(), int64_t(a.size()), k);
    TF_RETURN_IF_ERROR(output_vector(0, a.data(), kept));
    return output_vector(1, i.data(), kept);
  }

  // select_top of every element of `every` as a candidate: accumulate_candidates' pass with no
  // state at threshold 0 (which NaN passes too), then the selection in place, on the same lists.
  template <typename T>
  absl::Status select_every(const Tensor& every, int64_t k) const {
    auto [acc, index] = candidates<T>(every, Feedback{}, 0.0f);
    return output_kept(acc, index, cpu::select_top(acc.data(), index.data(), int64_t(acc.size()), k));
  }

  // Sums duplicates in input order directly (the GPU sorts the indices first).
  template <typename T>
  absl::Status sparse_unpack(const Tensor& values, const Tensor& index, UnpackScale scale, Tensor* dense) const {
    cpu::sparse_unpack(raw<T>(values), index.flat<int32_t>().data(), values.NumElements(), scale.value(),
                       dense->NumElements(), raw<T>(dense));
    return absl::OkStatus();
  }

  // The launcher writes the indices sorted (the GPU sorts afterwards).
  absl::Status random_k_indices(const Permutation& perm, int64_t k, Tensor* out) const {
    cpu::random_k_indices(perm, k, out->flat<int32_t>().data());
    return absl::OkStatus();
  }

  // One pass of fixed-size copies, which checks the indices' order and range as it writes.
  absl::Status wire_rows(const Tensor& values, const Tensor& index, int64_t start, int64_t length, Tensor* rows) const {
    if (!cpu::wire_rows(values.tensor_data().data(), DataTypeSize(values.dtype()), index.flat<int32_t>().data(),
                        index.NumElements(), start, length, rows->flat<uint8_t>().data()))
      return invalid("wire_rows: index should be strictly ascending and inside [start, start + length) = [", start,
                     ", ", start + length, ")");
    return absl::OkStatus();
  }

  // The elements of rows (markers dropped) into outputs 0 and 1: their count is known only after
  // the pass, so it writes to lists of one element a row first.
  template <typename T>
  absl::Status wire_columns(const Tensor& rows) const {
    const int64_t count = rows.dim_size(0);
    std::vector<T> values(count);
    std::vector<int32_t> index(count);
    const int64_t n = cpu::wire_columns(rows.flat<uint8_t>().data(), count, sizeof(T), values.data(), index.data());
    if (n < 0) return invalid("wire rows: an element comes before its bucket's marker row, or past 2^31 - 1");
    TF_RETURN_IF_ERROR(output_vector(0, values.data(), n));
    return output_vector(1, index.data(), n);
  }

 private:
  // The candidates of a pass, appended to this thread's lists, which are reused from call to call
  // (one pair per element type; output_kept gives back a list that grew too large).
  template <typename T>
  static std::pair<std::vector<float>&, std::vector<int32_t>&> candidates(const Tensor& grad, const Feedback& fb,
                                                                          float threshold) {
    static thread_local std::vector<float> acc;
    static thread_local std::vector<int32_t> index;
    acc.clear();
    index.clear();
    cpu::accumulate_candidates(raw<T>(grad), fb, grad.NumElements(), threshold, acc, index);
    return {acc, index};
  }

  // Outputs 0 and 1: the first n of candidates' lists; then their capacity kept or given back.
  absl::Status output_kept(std::vector<float>& acc, std::vector<int32_t>& index, int64_t n) const {
    absl::Status status = output_vector(0, acc.data(), n);
    if (status.ok()) status = output_vector(1, index.data(), n);
    cpu::kept_capacity(acc);
    cpu::kept_capacity(index);
    return status;
  }

  // Output `output`: a vector holding data[0, n).
  template <typename V>
  absl::Status output_vector(int output, const V* data, int64_t n) const {
    Tensor* t = nullptr;
    TF_RETURN_IF_ERROR(c_->allocate_output(output, TensorShape({n}), &t));
    std::copy(data, data + n, t->flat<V>().data());
    return absl::OkStatus();
  }

  OpKernelContext* c_;
};

}  // namespace tf_binding
}  // namespace sparsecomm
