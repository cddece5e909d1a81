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

// The error-feedback state of an op call: grad made contiguous, residual/momentum checked.
struct FeedbackArgs {
  at::Tensor grad;
  Feedback fb;
  FeedbackArgs(const char* op, const at::Tensor& grad_in, const c10::optional<at::Tensor>& residual,
               const c10::optional<at::Tensor>& momentum, double momentum_factor)
      : grad(grad_in.contiguous()) {
    check_indexable(op, grad.numel());
    fb.residual_in = fb.residual_out = state_ptr(op, "residual", grad, residual);
    fb.momentum_in = fb.momentum_out = state_ptr(op, "momentum", grad, momentum);
    fb.momentum = float(momentum_factor);
  }
};

at::Tensor sample_threshold_cpu(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                const c10::optional<at::Tensor>& momentum, double momentum_factor, double ratio,
                                int64_t sample_count, int64_t seed, int64_t tensor_id, int64_t step) {
  TORCH_CHECK(ratio > 0.0 && ratio <= 1.0, "sample_threshold: ratio should be in (0, 1], got ", ratio);
  TORCH_CHECK(sample_count >= 1, "sample_threshold: sample_count should be >= 1, got ", sample_count);
  TORCH_CHECK(tensor_id >= 0 && tensor_id <= 0xffffffffLL, "sample_threshold: tensor_id should be a uint32, got ",
              tensor_id);
  TORCH_CHECK(step >= 0, "sample_threshold: step should be >= 0, got ", step);
  FeedbackArgs a("sample_threshold", grad, residual, momentum, momentum_factor);
  const SamplePlan plan = plan_sample(a.grad.numel(), sample_count, ratio, uint64_t(seed), uint32_t(tensor_id),
                                      uint64_t(step));
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

// The state a send step writes: residual / momentum at the candidates' indices (checked).
Feedback send_feedback(const char* op, const at::Tensor& index, const c10::optional<at::Tensor>& residual,
                       const c10::optional<at::Tensor>& momentum, bool masking) {
  Feedback fb;
  fb.masking = masking;
  if (!residual.has_value() && !momentum.has_value()) return fb;
  const at::Tensor& like = residual.has_value() ? *residual : *momentum;
  fb.residual_out = state_ptr(op, "residual", like, residual);
  fb.momentum_out = state_ptr(op, "momentum", like, momentum);
  if (index.numel() > 0) {
    const int32_t* idx = index.data_ptr<int32_t>();
    const auto [lo, hi] = std::minmax_element(idx, idx + index.numel());
    TORCH_CHECK(*lo >= 0 && *hi < like.numel(), op, ": index should be in [0, ", like.numel(), "), got values in [",
                *lo, ", ", *hi, "]");
  }
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

void check_bits(const char* op, int64_t bits) {
  TORCH_CHECK(bits == 1 || bits == 2, op, ": bits should be 1 or 2, got ", bits);
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
  check_bits("dequantize", bits);
  TORCH_CHECK(codes_in.scalar_type() == at::kByte && codes_in.dim() == 1, "dequantize: codes should be a 1-D uint8 "
              "tensor, got ", codes_in.dim(), "-D ", codes_in.scalar_type());
  TORCH_CHECK(count >= 0 && codes_in.numel() == quantized_bytes(count, int(bits)), "dequantize: codes should have ",
              quantized_bytes(count, int(bits)), " bytes for ", count, " values of ", bits, " bits, got ",
              codes_in.numel());
  TORCH_CHECK(scales_in.scalar_type() == at::kFloat && scales_in.numel() == quantized_scales(int(bits)),
              "dequantize: scales should be ", quantized_scales(int(bits)), " float32 values, got ", scales_in.numel(),
              " ", scales_in.scalar_type());
  const at::Tensor codes = codes_in.contiguous(), scales = scales_in.contiguous();
  at::Tensor values = at::empty({count}, scales.options());
  cpu::dequantize(codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), count, int(bits), values.data_ptr<float>());
  return values;
}

at::Tensor random_k_indices_cpu(const at::Tensor& like, int64_t seed, int64_t tensor_id, int64_t step, int64_t k) {
  const int64_t numel = like.numel();
  check_indexable("random_k_indices", numel);
  TORCH_CHECK(k >= 0 && k <= numel, "random_k_indices: k should be in [0, numel=", numel, "], got ", k);
  TORCH_CHECK(tensor_id >= 0 && tensor_id <= 0xffffffffLL, "random_k_indices: tensor_id should be a uint32, got ",
              tensor_id);
  TORCH_CHECK(step >= 0, "random_k_indices: step should be >= 0, got ", step);
  at::Tensor out = at::empty({k}, like.options().dtype(at::kInt));
  cpu::random_k_indices(Permutation(uint64_t(seed), uint32_t(tensor_id), uint64_t(step), numel), k,
                        out.data_ptr<int32_t>());
  return out;
}

void sparse_unpack_into_cpu(const at::Tensor& values_in, const at::Tensor& index_in, double scale,
                            const at::Tensor& out) {
  TORCH_CHECK(values_in.dim() == 1, "sparse_unpack: values should be 1-D, got ", values_in.dim(), "-D");
  TORCH_CHECK(index_in.scalar_type() == at::kInt && index_in.dim() == 1,
              "sparse_unpack: index should be a 1-D int32 tensor, got ", index_in.dim(), "-D ", index_in.scalar_type());
  TORCH_CHECK(values_in.numel() == index_in.numel(), "sparse_unpack: values and index should have the same length, "
              "got ", values_in.numel(), " and ", index_in.numel());
  TORCH_CHECK(out.scalar_type() == values_in.scalar_type(), "sparse_unpack: out should be ", values_in.scalar_type(),
              " like values, got ", out.scalar_type());
  TORCH_CHECK(out.is_contiguous(), "sparse_unpack: out should be contiguous");
  const int64_t numel = out.numel();
  check_indexable("sparse_unpack", numel);
  const at::Tensor values = values_in.contiguous(), index = index_in.contiguous();
  if (index.numel() > 0) {
    const int32_t* idx = index.data_ptr<int32_t>();
    const auto [lo, hi] = std::minmax_element(idx, idx + index.numel());
    TORCH_CHECK(*lo >= 0 && *hi < numel, "sparse_unpack: index should be in [0, ", numel, "), got values in [", *lo,
                ", ", *hi, "]");
  }
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
