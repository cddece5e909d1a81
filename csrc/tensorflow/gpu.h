// The GPU device policy of the TF op kernels (common.h lists its members): csrc/cuda's
// launchers on TF's compute stream. Included only with GOOGLE_CUDA (setup.py defines it in
// CUDA builds); syntax-checked without a GPU by tests/test_build.py, never run on one so far.
//
// Host synchronisation: once, in accumulate_candidates (the number of candidates sizes its
// outputs), and once more in select_every, for a tensor below its band. Nothing else waits for
// the device: the threshold stays there, select_top's size min(count, k) is known on the host,
// and index ranges are not checked (check_index).
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>

#include "../cuda/launchers.h"
#include "common.h"
#include "xla/stream_executor/stream.h"

namespace sparsecomm {
namespace tf_binding {

inline absl::Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("sparsecomm: ", what, " failed: ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
}

class GpuDevice {
 public:
  // The raw stream, as TF's GetGpuStream (gpu_kernel_helper.h, a header for nvcc) finds it.
  explicit GpuDevice(OpKernelContext* c)
      : c_(c),
        stream_(reinterpret_cast<cudaStream_t>(c->op_device_context()->stream()->platform_specific_handle().stream)) {}

  // Not checked: reading the indices back would need a host synchronisation.
  absl::Status check_index(const Tensor&, int64_t, const char*) const { return absl::OkStatus(); }
  absl::Status copy(const float* from, int64_t n, float* to) const {
    return cuda_status(cudaMemcpyAsync(to, from, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                       "copying the state");
  }

  // The launchers, on TF's stream.
#define SC_GPU_LAUNCHER(name)             \
  template <typename... Args>             \
  absl::Status name(Args... args) const { \
    cuda::name(args..., stream_);         \
    return launched();                    \
  }
  SC_FORWARDED_LAUNCHERS(SC_GPU_LAUNCHER)
#undef SC_GPU_LAUNCHER

  // The threshold stays on the device (no synchronisation); the selection needs scratch.
  template <typename T>
  absl::Status sample_threshold(const Tensor& grad, const Feedback& fb, const SamplePlan& plan, Tensor* out) const {
    Tensor sample;
    TF_RETURN_IF_ERROR(c_->allocate_temp(DT_FLOAT, TensorShape({cuda::sample_scratch_floats(plan.count)}), &sample));
    cuda::sample_threshold(raw<T>(grad), fb, grad.NumElements(), plan, sample.flat<float>().data(),
                           out->flat<float>().data(), stream_);
    return launched();
  }

  // Threads cannot append to one list in index order: count per tile, scan, then compact.
  template <typename T>
  absl::Status accumulate_candidates(const Tensor& grad, const Feedback& fb, const Tensor& threshold) const {
    auto outputs = [&](int64_t total, Tensor** acc, Tensor** index) {
      TF_RETURN_IF_ERROR(c_->allocate_output(0, TensorShape({total}), acc));
      return c_->allocate_output(1, TensorShape({total}), index);
    };
    return candidates(raw<T>(grad), fb, grad.NumElements(), threshold.flat<float>().data(), outputs);
  }

  // A stable sort by magnitude instead of the CPU's in-place selection (sort.cu).
  absl::Status select_top(const Tensor& acc, const Tensor& index, int64_t k) const {
    const int64_t count = acc.NumElements();
    TF_RETURN_IF_ERROR(check_indexable(count));  // int32 positions
    Tensor *acc_top = nullptr, *index_top = nullptr;
    TF_RETURN_IF_ERROR(c_->allocate_output(0, TensorShape({std::min(count, k)}), &acc_top));
    TF_RETURN_IF_ERROR(c_->allocate_output(1, TensorShape({std::min(count, k)}), &index_top));
    return with_scratch([&](void* scratch) {
      return cuda::select_top(acc.flat<float>().data(), index.flat<int32_t>().data(), count, k,
                              acc_top->flat<float>().data(), index_top->flat<int32_t>().data(), scratch, stream_);
    });
  }

  // select_top of every element of `every` as a candidate, as the CPU's: the candidate pass with
  // no state at a threshold of 0 into temporaries, then the selection. A tensor below its band
  // only: its count is brought to the host once more.
  template <typename T>
  absl::Status select_every(const Tensor& every, int64_t k) const {
    Tensor zero, acc, index;
    TF_RETURN_IF_ERROR(c_->allocate_temp(DT_FLOAT, TensorShape({1}), &zero));
    float* threshold = zero.flat<float>().data();
    TF_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(threshold, 0, sizeof(float), stream_), "zeroing"));
    auto temporaries = [&](int64_t total, Tensor** acc_out, Tensor** index_out) {
      *acc_out = &acc;
      *index_out = &index;
      TF_RETURN_IF_ERROR(c_->allocate_temp(DT_FLOAT, TensorShape({total}), &acc));
      return c_->allocate_temp(DT_INT32, TensorShape({total}), &index);
    };
    TF_RETURN_IF_ERROR(candidates(raw<T>(every), Feedback{}, every.NumElements(), threshold, temporaries));
    return select_top(acc, index, k);
  }

  // Duplicates add in input order, deterministically: a stable sort groups them (threads
  // cannot add in input order as the CPU loop does).
  template <typename T>
  absl::Status sparse_unpack(const Tensor& values, const Tensor& index, UnpackScale scale, Tensor* dense) const {
    const int64_t count = values.NumElements();
    TF_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(raw<T>(dense), 0, dense->TotalBytes(), stream_), "zeroing"));
    Tensor sorted_index, order;
    TF_RETURN_IF_ERROR(c_->allocate_temp(DT_INT32, TensorShape({count}), &sorted_index));
    TF_RETURN_IF_ERROR(c_->allocate_temp(DT_INT64, TensorShape({count}), &order));
    TF_RETURN_IF_ERROR(with_scratch([&](void* scratch) {
      return cuda::sort_index(index.flat<int32_t>().data(), count, sorted_index.flat<int32_t>().data(),
                              order.flat<int64_t>().data(), scratch, stream_);
    }));
    cuda::sparse_unpack_sorted(raw<T>(values), sorted_index.flat<int32_t>().data(), order.flat<int64_t>().data(), count,
                               scale, raw<T>(dense), stream_);
    return launched();
  }

  // The launcher writes the first k indices of the permutation unsorted: sorted after.
  absl::Status random_k_indices(const Permutation& perm, int64_t k, Tensor* out) const {
    Tensor unsorted;
    TF_RETURN_IF_ERROR(c_->allocate_temp(DT_INT32, TensorShape({k}), &unsorted));
    cuda::random_k_indices(perm, k, unsorted.flat<int32_t>().data(), stream_);
    return with_scratch([&](void* scratch) {
      return cuda::sort_ascending(unsorted.flat<int32_t>().data(), k, out->flat<int32_t>().data(), scratch, stream_);
    });
  }

 private:
  absl::Status launched() const { return cuda_status(cudaGetLastError(), "a sparsecomm CUDA launch"); }

  // Runs a sort.cu launcher, launch(scratch), twice: without scratch to size it, then with a
  // temporary of that size.
  template <typename Launch>
  absl::Status with_scratch(Launch launch) const {
    Tensor scratch;
    TF_RETURN_IF_ERROR(c_->allocate_temp(DT_INT8, TensorShape({int64_t(launch(nullptr))}), &scratch));
    launch(scratch.flat<int8_t>().data());
    return launched();
  }

  // count_candidates, then the candidates compacted into the two tensors that allocate(total,
  // &acc, &index) makes (the op's outputs, or temporaries). acc is read back from the tensor that
  // now holds it (feedback.h): residual, momentum or grad.
  template <typename S, typename Allocate>
  absl::Status candidates(const S* grad, const Feedback& fb, int64_t numel, const float* threshold,
                          Allocate allocate) const {
    Tensor offsets;
    int64_t total = 0;
    TF_RETURN_IF_ERROR(count_candidates(grad, fb, numel, threshold, &offsets, &total));
    Tensor *acc = nullptr, *index = nullptr;
    TF_RETURN_IF_ERROR(allocate(total, &acc, &index));
    const float* state = fb.residual_out ? fb.residual_out : fb.momentum_out;
    const int64_t* offset = offsets.flat<int64_t>().data();
    float* acc_data = acc->flat<float>().data();
    int32_t* index_data = index->flat<int32_t>().data();
    if (state) {
      cuda::compact_candidates(state, numel, threshold, offset, acc_data, index_data, stream_);
    } else {
      cuda::compact_candidates(grad, numel, threshold, offset, acc_data, index_data, stream_);
    }
    return launched();
  }

  // The candidates of each tile counted (and the state written), the counts scanned into
  // *offsets, and their total brought to the host.
  template <typename S>
  absl::Status count_candidates(const S* grad, const Feedback& fb, int64_t numel, const float* threshold,
                                Tensor* offsets, int64_t* total) const {
    const int64_t tiles = cuda::candidate_tiles(numel);
    Tensor counts;  // tiles + 1 entries, the last staying 0: the scan's last entry is the total
    TF_RETURN_IF_ERROR(c_->allocate_temp(DT_INT32, TensorShape({tiles + 1}), &counts));
    TF_RETURN_IF_ERROR(c_->allocate_temp(DT_INT64, TensorShape({tiles + 1}), offsets));
    int32_t* count = counts.flat<int32_t>().data();
    int64_t* offset = offsets->flat<int64_t>().data();
    TF_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(count, 0, counts.TotalBytes(), stream_), "zeroing"));
    cuda::accumulate_count(grad, fb, numel, threshold, count, stream_);
    TF_RETURN_IF_ERROR(
        with_scratch([&](void* scratch) { return cuda::candidate_offsets(count, tiles, offset, scratch, stream_); }));
    // The one host synchronisation of the TF GPU kernels: the total sizes the op's outputs.
    TF_RETURN_IF_ERROR(cuda_status(
        cudaMemcpyAsync(total, offset + tiles, sizeof(int64_t), cudaMemcpyDeviceToHost, stream_), "reading the count"));
    return cuda_status(cudaStreamSynchronize(stream_), "waiting for the candidate count");
  }

  OpKernelContext* c_;
  cudaStream_t stream_;
};

}  // namespace tf_binding
}  // namespace sparsecomm
