// CPU registration of the sparsecomm torch ops: csrc/cpu launchers.
#include <algorithm>
#include <cmath>
#include <vector>

#include "block_ops.h"
#include "../cpu/launchers.h"

namespace sparsecomm {
namespace torch_binding {
namespace {

struct CpuDevice {
  struct Guard { explicit Guard(const at::Device&) {} };
  template <typename T, typename... Args> static void block_pack(Args... args) { cpu::block_pack<T>(args...); }
  template <typename T, typename... Args> static void block_unpack(Args... args) { cpu::block_unpack<T>(args...); }
};

at::Tensor sample_threshold_cpu(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                const c10::optional<at::Tensor>& momentum, double momentum_factor, double ratio,
                                int64_t sample_count, int64_t seed, int64_t tensor_id, int64_t step) {
  FeedbackArgs a("sample_threshold", grad, residual, momentum, momentum_factor);
  const SamplePlan plan = checked_sample_plan(a.grad.numel(), ratio, sample_count, seed, tensor_id, step);
  const float t = SC_DISPATCH_FLOAT_TYPES(a.grad.scalar_type(), "sample_threshold", [&] {
    return cpu::sample_threshold<scalar_t>(data_as<scalar_t>(a.grad), a.fb, a.grad.numel(), plan);
  });
  return at::scalar_tensor(t, a.grad.options().dtype(at::kFloat));
}

std::tuple<at::Tensor, at::Tensor> to_tensors(const std::vector<float>& acc, const std::vector<int32_t>& index) {
  at::Tensor acc_t = at::empty({int64_t(acc.size())}, at::kFloat);
  at::Tensor index_t = at::empty({int64_t(index.size())}, at::kInt);
  std::copy(acc.begin(), acc.end(), acc_t.data_ptr<float>());
  std::copy(index.begin(), index.end(), index_t.data_ptr<int32_t>());
  return {acc_t, index_t};
}

std::tuple<at::Tensor, at::Tensor> accumulate_candidates_cpu(const at::Tensor& grad,
                                                             const c10::optional<at::Tensor>& residual,
                                                             const c10::optional<at::Tensor>& momentum,
                                                             double momentum_factor, const at::Tensor& threshold) {
  TORCH_CHECK(threshold.numel() == 1, "accumulate_candidates: threshold should have one element, got ",
              threshold.numel());
  FeedbackArgs a("accumulate_candidates", grad, residual, momentum, momentum_factor);
  const float t = threshold.item<float>();
  std::vector<float> acc;
  std::vector<int32_t> index;
  SC_DISPATCH_FLOAT_TYPES(a.grad.scalar_type(), "accumulate_candidates", [&] {
    cpu::accumulate_candidates<scalar_t>(data_as<scalar_t>(a.grad), a.fb, a.grad.numel(), t, acc, index);
  });
  return to_tensors(acc, index);
}

std::tuple<at::Tensor, at::Tensor> select_top_cpu(const at::Tensor& acc_in, const at::Tensor& index_in, int64_t k) {
  check_candidates("select_top", acc_in, index_in);
  TORCH_CHECK(k >= 0, "select_top: k should be >= 0, got ", k);
  at::Tensor acc = acc_in.contiguous().clone(), index = index_in.contiguous().clone();
  const int64_t kept = cpu::select_top(acc.data_ptr<float>(), index.data_ptr<int32_t>(), acc.numel(), k);
  return {acc.narrow(0, 0, kept), index.narrow(0, 0, kept)};
}

// The state a send step writes, with the candidates' indices checked against it.
Feedback send_feedback(const char* op, const at::Tensor& index, const c10::optional<at::Tensor>& residual,
                       const c10::optional<at::Tensor>& momentum, bool masking) {
  const Feedback fb = send_state(op, residual, momentum, masking);
  if (fb.residual_out || fb.momentum_out) check_index_range(op, index, state_numel(residual, momentum));
  return fb;
}

at::Tensor send_selected_cpu(const at::Tensor& acc_in, const at::Tensor& index_in,
                             const c10::optional<at::Tensor>& residual, const c10::optional<at::Tensor>& momentum,
                             bool masking, at::ScalarType dtype) {
  check_candidates("send_selected", acc_in, index_in);
  const at::Tensor acc = acc_in.contiguous(), index = index_in.contiguous();
  const Feedback fb = send_feedback("send_selected", index, residual, momentum, masking);
  at::Tensor values = at::empty({acc.numel()}, acc.options().dtype(dtype));
  SC_DISPATCH_FLOAT_TYPES(dtype, "send_selected", [&] {
    cpu::send_selected<scalar_t>(acc.data_ptr<float>(), index.data_ptr<int32_t>(), acc.numel(), fb,
                                 data_as<scalar_t>(values));
  });
  return values;
}

std::tuple<at::Tensor, at::Tensor> send_quantized_cpu(const at::Tensor& acc_in, const at::Tensor& index_in,
                                                      const c10::optional<at::Tensor>& residual,
                                                      const c10::optional<at::Tensor>& momentum, bool masking,
                                                      int64_t bits) {
  check_candidates("send_quantized", acc_in, index_in);
  check_bits("send_quantized", bits);
  const at::Tensor acc = acc_in.contiguous(), index = index_in.contiguous();
  const Feedback fb = send_feedback("send_quantized", index, residual, momentum, masking);
  at::Tensor codes = at::empty({quantized_bytes(acc.numel(), int(bits))}, acc.options().dtype(at::kByte));
  at::Tensor scales = at::empty({quantized_scales(int(bits))}, acc.options());
  cpu::send_quantized(acc.data_ptr<float>(), index.data_ptr<int32_t>(), acc.numel(), fb, int(bits),
                      codes.data_ptr<uint8_t>(), scales.data_ptr<float>());
  return {codes, scales};
}

at::Tensor dequantize_cpu(const at::Tensor& codes_in, const at::Tensor& scales_in, int64_t count, int64_t bits) {
  check_dequantize_args(codes_in, scales_in, count, bits);
  const at::Tensor codes = codes_in.contiguous(), scales = scales_in.contiguous();
  at::Tensor values = at::empty({count}, scales.options());
  cpu::dequantize(codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), count, int(bits), values.data_ptr<float>());
  return values;
}

at::Tensor random_k_indices_cpu(const at::Tensor& like, int64_t seed, int64_t tensor_id, int64_t step, int64_t k) {
  const Permutation perm = checked_permutation(like.numel(), k, seed, tensor_id, step);
  at::Tensor out = at::empty({k}, like.options().dtype(at::kInt));
  cpu::random_k_indices(perm, k, out.data_ptr<int32_t>());
  return out;
}

void sparse_unpack_into_cpu(const at::Tensor& values_in, const at::Tensor& index_in, double scale,
                            const at::Tensor& out) {
  check_unpack_args(values_in, index_in, out);
  const int64_t numel = out.numel();
  const at::Tensor values = values_in.contiguous(), index = index_in.contiguous();
  check_index_range("sparse_unpack", index, numel);
  SC_DISPATCH_FLOAT_TYPES(values.scalar_type(), "sparse_unpack", [&] {
    cpu::sparse_unpack<scalar_t>(data_as<scalar_t>(values), index.data_ptr<int32_t>(), values.numel(), float(scale),
                                 numel, data_as<scalar_t>(out));
  });
}

at::Tensor sparse_unpack_cpu(const at::Tensor& values, const at::Tensor& index, int64_t numel, double scale) {
  TORCH_CHECK(numel >= 0, "sparse_unpack: numel should be >= 0, got ", numel);
  at::Tensor dense = at::empty({numel}, values.options());
  sparse_unpack_into_cpu(values, index, scale, dense);
  return dense;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsecomm, CPU, m) {
  register_block_ops<CpuDevice>(m);
  m.impl("sample_threshold", &sample_threshold_cpu);
  m.impl("accumulate_candidates", &accumulate_candidates_cpu);
  m.impl("select_top", &select_top_cpu);
  m.impl("send_selected", &send_selected_cpu);
  m.impl("sparse_unpack", &sparse_unpack_cpu);
  m.impl("sparse_unpack_into", &sparse_unpack_into_cpu);
  m.impl("random_k_indices", &random_k_indices_cpu);
  m.impl("send_quantized", &send_quantized_cpu);
  m.impl("dequantize", &dequantize_cpu);
}

}  // namespace torch_binding
}  // namespace sparsecomm
