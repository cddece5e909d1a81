// The select family's torch ops (csrc/kernels/feedback.h, sample.h, permutation.h; launchers
// in csrc/cpu/select.cpp, csrc/cuda/select.cu), each body written once over a device policy
// (common.h). Where a device computes differently, the body calls the policy's step.
#pragma once
#include <numeric>

#include "common.h"

namespace sparsecomm {
namespace torch_binding {

template <typename Device>
at::Tensor sample_threshold(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                            const c10::optional<at::Tensor>& momentum, double momentum_factor, double ratio,
                            int64_t sample_count, int64_t seed, int64_t tensor_id, int64_t step) {
  const typename Device::Guard guard(grad.device());
  FeedbackArgs a("sample_threshold", grad, residual, momentum, momentum_factor);
  const SamplePlan plan = checked_sample_plan(a.grad.numel(), ratio, sample_count, seed, tensor_id, step);
  return SC_DISPATCH_FLOAT_TYPES(a.grad.scalar_type(), "sample_threshold", [&] {
    return Device::template sample_threshold<scalar_t>(a, plan);
  });
}

template <typename Device>
std::tuple<at::Tensor, at::Tensor> accumulate_candidates(const at::Tensor& grad,
                                                         const c10::optional<at::Tensor>& residual,
                                                         const c10::optional<at::Tensor>& momentum,
                                                         double momentum_factor, const at::Tensor& threshold) {
  const typename Device::Guard guard(grad.device());
  TORCH_CHECK(threshold.numel() == 1, "accumulate_candidates: threshold should have one element, got ",
              threshold.numel());
  FeedbackArgs a("accumulate_candidates", grad, residual, momentum, momentum_factor);
  return SC_DISPATCH_FLOAT_TYPES(a.grad.scalar_type(), "accumulate_candidates", [&] {
    return Device::template accumulate_candidates<scalar_t>(a, threshold);
  });
}

template <typename Device>
std::tuple<at::Tensor, at::Tensor> select_top(const at::Tensor& acc, const at::Tensor& index, int64_t k) {
  const typename Device::Guard guard(acc.device());
  check_candidates("select_top", acc, index);
  TORCH_CHECK(k >= 0, "select_top: k should be >= 0, got ", k);
  return Device::select_top(acc, index, k);
}

template <typename Device>
at::Tensor send_selected(const at::Tensor& acc_in, const at::Tensor& index_in,
                         const c10::optional<at::Tensor>& residual, const c10::optional<at::Tensor>& momentum,
                         bool masking, at::ScalarType dtype) {
  const typename Device::Guard guard(acc_in.device());
  check_candidates("send_selected", acc_in, index_in);
  const at::Tensor acc = acc_in.contiguous(), index = index_in.contiguous();
  const Feedback fb = send_feedback<Device>("send_selected", index, residual, momentum, masking);
  at::Tensor values = at::empty({acc.numel()}, acc.options().dtype(dtype));
  SC_DISPATCH_FLOAT_TYPES(dtype, "send_selected", [&] {
    Device::template send_selected<scalar_t>(acc.data_ptr<float>(), index.data_ptr<int32_t>(), acc.numel(), fb,
                                             data_as<scalar_t>(values));
  });
  return values;
}

template <typename Device>
void sparse_unpack_into(const at::Tensor& values_in, const at::Tensor& index_in, double scale,
                        const at::Tensor& out) {
  const typename Device::Guard guard(out.device());
  check_unpack_args(values_in, index_in, out);
  const at::Tensor values = values_in.contiguous(), index = index_in.contiguous();
  Device::check_index_range("sparse_unpack", index, out.numel());
  SC_DISPATCH_FLOAT_TYPES(values.scalar_type(), "sparse_unpack", [&] {
    Device::template sparse_unpack<scalar_t>(values, index, float(scale), out);
  });
}

template <typename Device>
at::Tensor sparse_unpack(const at::Tensor& values, const at::Tensor& index, int64_t numel, double scale) {
  TORCH_CHECK(numel >= 0, "sparse_unpack: numel should be >= 0, got ", numel);
  at::Tensor dense = at::empty({numel}, values.options());
  sparse_unpack_into<Device>(values, index, scale, dense);
  return dense;
}

// The (index, value) rows of sparsecomm/core/wire.py: row j is index[j] (int32), then the bytes of
// values[j]. Built and split in the widest integer unit that tiles both columns (one copy per
// column, on either device), each in one op: the steps of a handful of Python-level torch calls,
// without their overhead (3-4 us each on a CPU) for every tensor.
constexpr int64_t kIndexBytes = sizeof(int32_t);  // core/wire.py's INDEX_BYTES

inline at::ScalarType row_unit(int64_t value_bytes) {
  switch (std::gcd(int64_t(kIndexBytes), value_bytes)) {
    case 4: return at::kInt;
    case 2: return at::kShort;
    default: return at::kByte;
  }
}

template <typename Device>
at::Tensor wire_rows(const at::Tensor& values, const at::Tensor& index) {
  const typename Device::Guard guard(values.device());
  TORCH_CHECK(values.dim() == 1, "wire_rows: values should be 1-D, got ", values.dim(), "-D");
  TORCH_CHECK(index.scalar_type() == at::kInt && index.dim() == 1,
              "wire_rows: index should be a 1-D int32 tensor, got ", index.dim(), "-D ", index.scalar_type());
  TORCH_CHECK(values.numel() == index.numel(), "wire_rows: values and index should have the same length, got ",
              values.numel(), " and ", index.numel());
  TORCH_CHECK(index.device() == values.device(), "wire_rows: values and index should be on one device");
  const int64_t k = index.numel(), value_bytes = values.element_size();
  const at::ScalarType unit = row_unit(value_bytes);
  const int64_t unit_bytes = c10::elementSize(unit), index_units = kIndexBytes / unit_bytes;
  at::Tensor rows = at::empty({k, kIndexBytes + value_bytes}, values.options().dtype(at::kByte));
  const at::Tensor units = rows.view(unit);
  units.narrow(1, 0, index_units).copy_(index.contiguous().view(unit).view({k, index_units}));
  units.narrow(1, index_units, value_bytes / unit_bytes)
      .copy_(values.contiguous().view(unit).view({k, value_bytes / unit_bytes}));
  return rows;
}

// The columns of wire rows whose values are `value_dtype`: (values, index int32), each a copy.
template <typename Device>
std::tuple<at::Tensor, at::Tensor> wire_columns(const at::Tensor& rows_in, at::ScalarType value_dtype) {
  const typename Device::Guard guard(rows_in.device());
  const int64_t value_bytes = c10::elementSize(value_dtype), width = kIndexBytes + value_bytes;
  TORCH_CHECK(rows_in.scalar_type() == at::kByte && rows_in.dim() == 2 && rows_in.size(1) == width,
              "wire_columns: rows should be a 2-D uint8 tensor of ", width, " columns (an int32 index, then a ",
              value_dtype, " value), got ", rows_in.dim(), "-D ", rows_in.scalar_type(), " of shape ",
              rows_in.sizes());
  const at::ScalarType unit = row_unit(value_bytes);
  const int64_t unit_bytes = c10::elementSize(unit), index_units = kIndexBytes / unit_bytes;
  const at::Tensor units = rows_in.contiguous().view(unit);
  // (flattened before the dtype view: an empty column keeps its row stride, which no view accepts)
  return {units.narrow(1, index_units, value_bytes / unit_bytes).reshape({-1}).contiguous().view(value_dtype),
          units.narrow(1, 0, index_units).reshape({-1}).contiguous().view(at::kInt)};
}

// sparse_unpack_into of gathered wire rows (each rank's, in rank order), their values cast to
// out's dtype.
template <typename Device>
void sparse_unpack_rows_into(const at::Tensor& rows, at::ScalarType value_dtype, double scale,
                             const at::Tensor& out) {
  const auto [values, index] = wire_columns<Device>(rows, value_dtype);
  sparse_unpack_into<Device>(values.to(out.scalar_type()), index, scale, out);
}

template <typename Device>
at::Tensor random_k_indices(const at::Tensor& like, int64_t seed, int64_t tensor_id, int64_t step, int64_t k) {
  const typename Device::Guard guard(like.device());
  const Permutation perm = checked_permutation(like.numel(), k, seed, tensor_id, step);
  return Device::random_k_indices(perm, k, at::empty({k}, like.options().dtype(at::kInt)));
}

template <typename Device>
void register_select_ops(torch::Library& m) {
  m.impl("sample_threshold", &sample_threshold<Device>);
  m.impl("accumulate_candidates", &accumulate_candidates<Device>);
  m.impl("select_top", &select_top<Device>);
  m.impl("send_selected", &send_selected<Device>);
  m.impl("sparse_unpack", &sparse_unpack<Device>);
  m.impl("sparse_unpack_into", &sparse_unpack_into<Device>);
  m.impl("random_k_indices", &random_k_indices<Device>);
  m.impl("wire_rows", &wire_rows<Device>);
  m.impl("wire_columns", &wire_columns<Device>);
  m.impl("sparse_unpack_rows_into", &sparse_unpack_rows_into<Device>);
}

}  // namespace torch_binding
}  // namespace sparsecomm
