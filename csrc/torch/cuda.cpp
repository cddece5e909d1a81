// CUDA registration of the sparsecomm torch ops: csrc/cuda launchers on torch's current
// stream. Compiled only into CUDA builds (setup.py); syntax-checked without a GPU by the tests.
// Host synchronisation happens only where a size is needed (the candidate count, to allocate
// the output). Index range checks are CPU-only: on CUDA they would need a synchronisation.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include "block_ops.h"
#include "../cuda/launchers.h"

namespace sparsecomm {
namespace torch_binding {
namespace {

cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream(); }

struct CudaDevice {
  using Guard = c10::cuda::CUDAGuard;
  template <typename T, typename... Args> static void block_pack(Args... args) { cuda::block_pack<T>(args..., stream()); }
  template <typename T, typename... Args> static void block_unpack(Args... args) {
    cuda::block_unpack<T>(args..., stream());
  }
};

at::Tensor sample_threshold_cuda(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                 const c10::optional<at::Tensor>& momentum, double momentum_factor, double ratio,
                                 int64_t sample_count, int64_t seed, int64_t tensor_id, int64_t step) {
  const c10::cuda::CUDAGuard guard(grad.device());
  FeedbackArgs a("sample_threshold", grad, residual, momentum, momentum_factor);
  const SamplePlan plan = checked_sample_plan(a.grad.numel(), ratio, sample_count, seed, tensor_id, step);
  at::Tensor sample = at::empty({plan.count}, a.grad.options().dtype(at::kFloat));
  at::Tensor threshold = at::empty({}, a.grad.options().dtype(at::kFloat));
  SC_DISPATCH_FLOAT_TYPES(a.grad.scalar_type(), "sample_threshold", [&] {
    cuda::sample_threshold<scalar_t>(data_as<scalar_t>(a.grad), a.fb, a.grad.numel(), plan, sample.data_ptr<float>(),
                                     threshold.data_ptr<float>(), stream());
  });
  return threshold;
}

std::tuple<at::Tensor, at::Tensor> accumulate_candidates_cuda(const at::Tensor& grad,
                                                              const c10::optional<at::Tensor>& residual,
                                                              const c10::optional<at::Tensor>& momentum,
                                                              double momentum_factor, const at::Tensor& threshold_in) {
  const c10::cuda::CUDAGuard guard(grad.device());
  TORCH_CHECK(threshold_in.numel() == 1, "accumulate_candidates: threshold should have one element, got ",
              threshold_in.numel());
  FeedbackArgs a("accumulate_candidates", grad, residual, momentum, momentum_factor);
  const int64_t numel = a.grad.numel();
  const at::Tensor threshold = threshold_in.to(a.grad.device(), at::kFloat).reshape({});
  const int64_t tiles = cuda::candidate_tiles(numel);
  at::Tensor counts = at::zeros({tiles}, a.grad.options().dtype(at::kInt));
  SC_DISPATCH_FLOAT_TYPES(a.grad.scalar_type(), "accumulate_candidates", [&] {
    cuda::accumulate_count<scalar_t>(data_as<scalar_t>(a.grad), a.fb, numel, threshold.data_ptr<float>(),
                                     counts.data_ptr<int32_t>(), stream());
  });
  const at::Tensor inclusive = counts.cumsum(0, at::kLong);
  const at::Tensor offsets = inclusive - counts;
  const int64_t total = tiles ? inclusive[tiles - 1].item<int64_t>() : 0;  // the one sync: the output's size
  at::Tensor acc = at::empty({total}, a.grad.options().dtype(at::kFloat));
  at::Tensor index = at::empty({total}, a.grad.options().dtype(at::kInt));
  // acc is read back from the tensor that now holds it (feedback.h): residual, momentum or grad.
  const float* state = a.fb.residual_out ? a.fb.residual_out : a.fb.momentum_out;
  if (state) {
    cuda::compact_candidates<float>(state, numel, threshold.data_ptr<float>(), offsets.data_ptr<int64_t>(),
                                    acc.data_ptr<float>(), index.data_ptr<int32_t>(), stream());
  } else {
    SC_DISPATCH_FLOAT_TYPES(a.grad.scalar_type(), "accumulate_candidates", [&] {
      cuda::compact_candidates<scalar_t>(data_as<scalar_t>(a.grad), numel, threshold.data_ptr<float>(),
                                         offsets.data_ptr<int64_t>(), acc.data_ptr<float>(),
                                         index.data_ptr<int32_t>(), stream());
    });
  }
  return {acc, index};
}

std::tuple<at::Tensor, at::Tensor> select_top_cuda(const at::Tensor& acc, const at::Tensor& index, int64_t k) {
  const c10::cuda::CUDAGuard guard(acc.device());
  check_candidates("select_top", acc, index);
  TORCH_CHECK(k >= 0, "select_top: k should be >= 0, got ", k);
  if (k >= acc.numel()) return {acc.clone(), index.clone()};
  // A stable sort keeps equal magnitudes in index order (candidates come in index order).
  const at::Tensor magnitude = at::where(acc.isnan(), INFINITY, acc.abs());
  const at::Tensor order = std::get<1>(magnitude.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
  const at::Tensor keep = std::get<0>(order.narrow(0, 0, k).sort());
  return {acc.index_select(0, keep), index.index_select(0, keep)};
}

at::Tensor send_selected_cuda(const at::Tensor& acc_in, const at::Tensor& index_in,
                              const c10::optional<at::Tensor>& residual, const c10::optional<at::Tensor>& momentum,
                              bool masking, at::ScalarType dtype) {
  const c10::cuda::CUDAGuard guard(acc_in.device());
  check_candidates("send_selected", acc_in, index_in);
  const at::Tensor acc = acc_in.contiguous(), index = index_in.contiguous();
  const Feedback fb = send_state("send_selected", residual, momentum, masking);
  at::Tensor values = at::empty({acc.numel()}, acc.options().dtype(dtype));
  SC_DISPATCH_FLOAT_TYPES(dtype, "send_selected", [&] {
    cuda::send_selected<scalar_t>(acc.data_ptr<float>(), index.data_ptr<int32_t>(), acc.numel(), fb,
                                  data_as<scalar_t>(values), stream());
  });
  return values;
}

std::tuple<at::Tensor, at::Tensor> send_quantized_cuda(const at::Tensor& acc_in, const at::Tensor& index_in,
                                                       const c10::optional<at::Tensor>& residual,
                                                       const c10::optional<at::Tensor>& momentum, bool masking,
                                                       int64_t bits) {
  const c10::cuda::CUDAGuard guard(acc_in.device());
  check_candidates("send_quantized", acc_in, index_in);
  check_bits("send_quantized", bits);
  const at::Tensor acc = acc_in.contiguous(), index = index_in.contiguous();
  const Feedback fb = send_state("send_quantized", residual, momentum, masking);
  at::Tensor codes = at::empty({quantized_bytes(acc.numel(), int(bits))}, acc.options().dtype(at::kByte));
  at::Tensor scales = at::empty({quantized_scales(int(bits))}, acc.options());
  cuda::send_quantized(acc.data_ptr<float>(), index.data_ptr<int32_t>(), acc.numel(), fb, int(bits),
                       codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), stream());
  return {codes, scales};
}

at::Tensor dequantize_cuda(const at::Tensor& codes_in, const at::Tensor& scales_in, int64_t count, int64_t bits) {
  const c10::cuda::CUDAGuard guard(codes_in.device());
  check_dequantize_args(codes_in, scales_in, count, bits);
  const at::Tensor codes = codes_in.contiguous(), scales = scales_in.contiguous();
  at::Tensor values = at::empty({count}, scales.options());
  cuda::dequantize(codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), count, int(bits), values.data_ptr<float>(),
                   stream());
  return values;
}

void sparse_unpack_into_cuda(const at::Tensor& values_in, const at::Tensor& index_in, double scale,
                             const at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(out.device());
  check_unpack_args(values_in, index_in, out);
  const at::Tensor values = values_in.contiguous();
  out.zero_();
  // Duplicates add in input order, deterministically: a stable sort groups them.
  const auto [sorted_index, order] = index_in.contiguous().sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
  SC_DISPATCH_FLOAT_TYPES(values.scalar_type(), "sparse_unpack", [&] {
    cuda::sparse_unpack_sorted<scalar_t>(data_as<scalar_t>(values), sorted_index.data_ptr<int32_t>(),
                                         order.data_ptr<int64_t>(), values.numel(), float(scale),
                                         data_as<scalar_t>(out), stream());
  });
}

at::Tensor sparse_unpack_cuda(const at::Tensor& values, const at::Tensor& index, int64_t numel, double scale) {
  TORCH_CHECK(numel >= 0, "sparse_unpack: numel should be >= 0, got ", numel);
  at::Tensor dense = at::empty({numel}, values.options());
  sparse_unpack_into_cuda(values, index, scale, dense);
  return dense;
}

at::Tensor random_k_indices_cuda(const at::Tensor& like, int64_t seed, int64_t tensor_id, int64_t step, int64_t k) {
  const c10::cuda::CUDAGuard guard(like.device());
  const Permutation perm = checked_permutation(like.numel(), k, seed, tensor_id, step);
  at::Tensor out = at::empty({k}, like.options().dtype(at::kInt));
  cuda::random_k_indices(perm, k, out.data_ptr<int32_t>(), stream());
  return std::get<0>(out.sort());
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsecomm, CUDA, m) {
  register_block_ops<CudaDevice>(m);
  m.impl("sample_threshold", &sample_threshold_cuda);
  m.impl("accumulate_candidates", &accumulate_candidates_cuda);
  m.impl("select_top", &select_top_cuda);
  m.impl("send_selected", &send_selected_cuda);
  m.impl("send_quantized", &send_quantized_cuda);
  m.impl("dequantize", &dequantize_cuda);
  m.impl("sparse_unpack", &sparse_unpack_cuda);
  m.impl("sparse_unpack_into", &sparse_unpack_into_cuda);
  m.impl("random_k_indices", &random_k_indices_cuda);
}

}  // namespace torch_binding
}  // namespace sparsecomm
