// The block family's torch ops (csrc/kernels/block.h, philox.h), each body written once over
// a device policy (common.h says what a policy provides; cpu.cpp and cuda.cpp define one).
#pragma once
#include "../kernels/philox.h"
#include "common.h"

namespace sparsecomm {
namespace torch_binding {

// Device-free (a pure function of its arguments): registered with its schema in ops.cpp.
inline int64_t random_block_start(int64_t seed, int64_t tensor_id, int64_t step, int64_t numel) {
  TORCH_CHECK(numel >= 0, "random_block_start: numel should be >= 0, got ", numel);
  TORCH_CHECK(tensor_id >= 0 && tensor_id <= 0xffffffffLL, "random_block_start: tensor_id should be a uint32, got ",
              tensor_id);
  TORCH_CHECK(step >= 0, "random_block_start: step should be >= 0, got ", step);
  return sparsecomm::random_block_start(uint64_t(seed), uint32_t(tensor_id), uint64_t(step), numel);
}

template <typename Device>
at::Tensor block_pack(const at::Tensor& grad_in, const c10::optional<at::Tensor>& residual, int64_t start,
                      int64_t length) {
  const typename Device::Guard guard(grad_in.device());
  const at::Tensor grad = grad_in.contiguous();
  check_block("block_pack", grad.numel(), start, length);
  float* res = state_ptr("block_pack", "residual", grad, residual);
  at::Tensor values = at::empty({length}, grad.options());
  SC_DISPATCH_FLOAT_TYPES(grad.scalar_type(), "block_pack", [&] {
    Device::template block_pack<scalar_t>(data_as<scalar_t>(grad), res, res, data_as<scalar_t>(values), grad.numel(),
                                          start, length);
  });
  return values;
}

template <typename Device>
void block_unpack_into(const at::Tensor& values_in, int64_t start, double scale, const at::Tensor& out) {
  const typename Device::Guard guard(out.device());
  const at::Tensor values = values_in.contiguous();
  TORCH_CHECK(values.dim() == 1, "block_unpack: values should be 1-D, got ", values.dim(), "-D");
  TORCH_CHECK(out.scalar_type() == values.scalar_type(), "block_unpack: out should be ", values.scalar_type(),
              " like values, got ", out.scalar_type());
  TORCH_CHECK(out.is_contiguous(), "block_unpack: out should be contiguous");
  TORCH_CHECK(out.device() == values.device(), "block_unpack: values and out should be on one device");
  check_block("block_unpack", out.numel(), start, values.numel());
  SC_DISPATCH_FLOAT_TYPES(values.scalar_type(), "block_unpack", [&] {
    Device::template block_unpack<scalar_t>(data_as<scalar_t>(values), data_as<scalar_t>(out), out.numel(), start,
                                            values.numel(), float(scale));
  });
}

template <typename Device>
at::Tensor block_unpack(const at::Tensor& values, int64_t numel, int64_t start, double scale) {
  TORCH_CHECK(numel >= 0, "block_unpack: numel should be >= 0, got ", numel);
  at::Tensor dense = at::empty({numel}, values.options());
  block_unpack_into<Device>(values, start, scale, dense);
  return dense;
}

template <typename Device>
void register_block_ops(torch::Library& m) {
  m.impl("block_pack", &block_pack<Device>);
  m.impl("block_unpack", &block_unpack<Device>);
  m.impl("block_unpack_into", &block_unpack_into<Device>);
}

}  // namespace torch_binding
}  // namespace sparsecomm
