// The quantize family's torch ops (csrc/kernels/quantize.h; launchers in csrc/cpu/quantize.cpp,
// csrc/cuda/select.cu), each body written once over a device policy (common.h).
#pragma once
#include "common.h"

namespace sparsecomm {
namespace torch_binding {

template <typename Device>
std::tuple<at::Tensor, at::Tensor> send_quantized(const at::Tensor& acc_in, const at::Tensor& index_in,
                                                  const c10::optional<at::Tensor>& residual,
                                                  const c10::optional<at::Tensor>& momentum, bool masking,
                                                  int64_t bits) {
  const typename Device::Guard guard(acc_in.device());
  check_candidates("send_quantized", acc_in, index_in);
  check_bits("send_quantized", bits);
  const at::Tensor acc = acc_in.contiguous(), index = index_in.contiguous();
  const Feedback fb = send_feedback<Device>("send_quantized", index, residual, momentum, masking);
  at::Tensor codes = at::empty({quantized_bytes(acc.numel(), int(bits))}, acc.options().dtype(at::kByte));
  at::Tensor scales = at::empty({quantized_scales(int(bits))}, acc.options());
  Device::send_quantized(acc.data_ptr<float>(), index.data_ptr<int32_t>(), acc.numel(), fb, int(bits),
                         codes.data_ptr<uint8_t>(), scales.data_ptr<float>());
  return {codes, scales};
}

template <typename Device>
at::Tensor dequantize(const at::Tensor& codes_in, const at::Tensor& scales_in, int64_t count, int64_t bits) {
  const typename Device::Guard guard(codes_in.device());
  check_dequantize_args(codes_in, scales_in, count, bits);
  const at::Tensor codes = codes_in.contiguous(), scales = scales_in.contiguous();
  at::Tensor values = at::empty({count}, scales.options());
  Device::dequantize(codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), count, int(bits),
                     values.data_ptr<float>());
  return values;
}

template <typename Device>
void register_quantize_ops(torch::Library& m) {
  m.impl("send_quantized", &send_quantized<Device>);
  m.impl("dequantize", &dequantize<Device>);
}

}  // namespace torch_binding
}  // namespace sparsecomm
