// CUDA registration of the sparsecomm torch ops: the device policy over csrc/cuda's launchers
// (on torch's current stream), and the op bodies of block.h, select.h and quantize.h
// instantiated with it. Compiled only into CUDA builds (setup.py); syntax-checked without a
// GPU by the tests. Host synchronisation happens only where a size is needed (the candidate
// count, to allocate the output; each rank's count in Horovod's gathered 1-/2-bit segments); a DDP
// bucket's fixed-capacity ops read none. The bucket
// phases come from cuda_bucket.h, the wire and segment phases from cuda_wire.h.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <tuple>

#include "../cuda/launchers.h"
#include "block.h"
#include "cuda_bucket.h"
#include "cuda_wire.h"
#include "quantize.h"
#include "select.h"

namespace sparsecomm {
namespace torch_binding {
namespace {

struct CudaDevice : CudaFixedBucket, CudaDenseSteps, CudaWire {
  using Guard = c10::cuda::CUDAGuard;

  // Not checked: reading the indices back would need a host synchronisation.
  static void check_index_range(const char*, const at::Tensor&, int64_t) {}

  // The launchers, on torch's current stream.
#define SC_CUDA_TYPED(name)               \
  template <typename T, typename... Args> \
  static void name(Args... args) {        \
    cuda::name<T>(args..., stream());     \
  }
#define SC_CUDA_UNTYPED(name)      \
  template <typename... Args>      \
  static void name(Args... args) { \
    cuda::name(args..., stream()); \
  }
  SC_TYPED_LAUNCHERS(SC_CUDA_TYPED)
  SC_UNTYPED_LAUNCHERS(SC_CUDA_UNTYPED)
#undef SC_CUDA_TYPED
#undef SC_CUDA_UNTYPED

  // The threshold stays on the device (no synchronisation); the selection needs scratch.
  template <typename T>
  static at::Tensor sample_threshold(const FeedbackArgs& a, const SamplePlan& plan) {
    at::Tensor sample = at::empty({cuda::sample_scratch_floats(plan.count)}, a.grad.options().dtype(at::kFloat));
    at::Tensor threshold = at::empty({}, a.grad.options().dtype(at::kFloat));
    cuda::sample_threshold<T>(data_as<T>(a.grad), a.fb, a.grad.numel(), plan, sample.data_ptr<float>(),
                              threshold.data_ptr<float>(), stream());
    return threshold;
  }

  // Threads cannot append to one list in index order: count per tile and scan, read the total
  // back to size the output (a synchronisation), then compact.
  template <typename T>
  static std::tuple<at::Tensor, at::Tensor> accumulate_candidates(const FeedbackArgs& a,
                                                                  const at::Tensor& threshold_in) {
    const int64_t numel = a.grad.numel(), tiles = cuda::candidate_tiles(numel);
    const at::Tensor threshold = threshold_in.to(a.grad.device(), at::kFloat).reshape({});
    at::Tensor counts = at::empty({tiles}, a.grad.options().dtype(at::kInt));
    cuda::accumulate_count<T>(data_as<T>(a.grad), a.fb, numel, threshold.data_ptr<float>(), counts.data_ptr<int32_t>(),
                              stream());
    const at::Tensor inclusive = counts.cumsum(0, at::kLong), offsets = inclusive - counts;
    const int64_t total = tiles ? read_back(inclusive[tiles - 1]).item<int64_t>() : 0;
    at::Tensor acc = at::empty({total}, a.grad.options().dtype(at::kFloat));
    at::Tensor index = at::empty({total}, a.grad.options().dtype(at::kInt));
    const float* t = threshold.data_ptr<float>();
    // acc is read back from the tensor that now holds it (feedback.h): residual, momentum or grad.
    const float* state = a.fb.residual_out ? a.fb.residual_out : a.fb.momentum_out;
    if (state) {
      cuda::compact_candidates<float>(state, numel, t, offsets.data_ptr<int64_t>(), acc.data_ptr<float>(),
                                      index.data_ptr<int32_t>(), stream());
    } else {
      cuda::compact_candidates<T>(data_as<T>(a.grad), numel, t, offsets.data_ptr<int64_t>(), acc.data_ptr<float>(),
                                  index.data_ptr<int32_t>(), stream());
    }
    return {acc, index};
  }

  // torch's sort instead of a selection kernel. A stable sort keeps equal magnitudes in index
  // order (candidates come in index order).
  static std::tuple<at::Tensor, at::Tensor> select_top(const at::Tensor& acc, const at::Tensor& index, int64_t k) {
    if (k >= acc.numel()) return {acc.clone(), index.clone()};
    const at::Tensor magnitude = at::where(acc.isnan(), INFINITY, acc.abs());
    const at::Tensor order = std::get<1>(magnitude.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
    const at::Tensor keep = std::get<0>(order.narrow(0, 0, k).sort());
    return {acc.index_select(0, keep), index.index_select(0, keep)};
  }

  // Duplicates add in input order, deterministically: a stable sort groups them (threads
  // cannot add in input order as the CPU loop does).
  template <typename T>
  static void sparse_unpack(const at::Tensor& values, const at::Tensor& index, UnpackScale scale,
                            const at::Tensor& out) {
    out.zero_();
    const auto [sorted_index, order] = index.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
    cuda::sparse_unpack_sorted<T>(data_as<T>(values), sorted_index.data_ptr<int32_t>(), order.data_ptr<int64_t>(),
                                  values.numel(), scale, data_as<T>(out), stream());
  }

  // The launcher writes the first k indices of the permutation unsorted.
  static at::Tensor random_k_indices(const Permutation& perm, int64_t k, at::Tensor out) {
    cuda::random_k_indices(perm, k, out.data_ptr<int32_t>(), stream());
    return std::get<0>(out.sort());
  }
};

}  // namespace

// The emulated CUDA test build (tests/cuda_emulation/torch_binding.cpp) registers this policy
// under its own namespace on the CPU key; every other build uses this default.
#ifndef SC_TORCH_CUDA_LIBRARY_IMPL
#define SC_TORCH_CUDA_LIBRARY_IMPL TORCH_LIBRARY_IMPL(sparsecomm, CUDA, m)
#endif

SC_TORCH_CUDA_LIBRARY_IMPL {
  register_block_ops<CudaDevice>(m);
  register_select_ops<CudaDevice>(m);
  register_quantize_ops<CudaDevice>(m);
}

}  // namespace torch_binding
}  // namespace sparsecomm
