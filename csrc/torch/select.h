// The select family's torch ops (csrc/kernels/feedback.h, sample.h, permutation.h, squares.h; launchers
// in csrc/cpu/select.cpp, csrc/cuda/select.cu), each body written once over a device policy
// (common.h). Where a device computes differently, the body calls the policy's step.
#pragma once
#include <array>
#include <cmath>
#include <cstring>

#include "common.h"

namespace sparsecomm {
namespace torch_binding {

template <typename Device>
at::Tensor sample_threshold(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                            const c10::optional<at::Tensor>& momentum, double momentum_factor, double ratio,
                            int64_t sample_count, int64_t seed, int64_t tensor_id, int64_t step,
                            const c10::optional<at::Tensor>& grad_scale, bool nesterov) {
  const typename Device::Guard guard(grad.device());
  FeedbackArgs a("sample_threshold", grad, residual, momentum, momentum_factor, grad_scale, nesterov);
  const SamplePlan plan = checked_sample_plan(a.grad.numel(), ratio, sample_count, seed, tensor_id, step);
  return SC_DISPATCH_FLOAT_TYPES(a.grad.scalar_type(), "sample_threshold",
                                 [&] { return Device::template sample_threshold<scalar_t>(a, plan); });
}

// The state arguments of a candidates' pass, checked (op: the name its errors give).
inline FeedbackArgs candidate_args(const char* op, const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                                   const c10::optional<at::Tensor>& momentum, double momentum_factor,
                                   const c10::optional<at::Tensor>& grad_scale, bool nesterov) {
  // (the candidates' acc is read back from the state the pass wrote, not from grad)
  TORCH_CHECK(!grad_scale.has_value() || residual.has_value() || momentum.has_value(), op,
              ": grad_scale needs a residual or a momentum, got neither");
  // (and Nesterov's acc is not the momentum: it is read back from the residual)
  TORCH_CHECK(!nesterov || residual.has_value(), op, ": nesterov=True needs a residual, got None");
  return FeedbackArgs(op, grad, residual, momentum, momentum_factor, grad_scale, nesterov);
}

// The state's pass, and the candidates at `threshold` (acc, index) in index order.
template <typename Device>
std::tuple<at::Tensor, at::Tensor> accumulate_candidates(const at::Tensor& grad,
                                                         const c10::optional<at::Tensor>& residual,
                                                         const c10::optional<at::Tensor>& momentum,
                                                         double momentum_factor, const at::Tensor& threshold,
                                                         const c10::optional<at::Tensor>& grad_scale, bool nesterov) {
  const typename Device::Guard guard(grad.device());
  TORCH_CHECK(threshold.numel() == 1, "accumulate_candidates: threshold should have one element, got ",
              threshold.numel());
  const FeedbackArgs a =
      candidate_args("accumulate_candidates", grad, residual, momentum, momentum_factor, grad_scale, nesterov);
  return SC_DISPATCH_FLOAT_TYPES(a.grad.scalar_type(), "accumulate_candidates",
                                 [&] { return Device::template accumulate_candidates<scalar_t>(a, threshold); });
}

template <typename Device>
std::tuple<at::Tensor, at::Tensor> select_top(const at::Tensor& acc, const at::Tensor& index, int64_t k) {
  const typename Device::Guard guard(acc.device());
  check_candidates("select_top", acc, index);
  TORCH_CHECK(k >= 0, "select_top: k should be >= 0, got ", k);
  return Device::select_top(acc, index, k);
}

// The sends of acc's candidates into the first acc.numel() of `values` (contiguous, their dtype).
template <typename Device>
void send_selected_into(const at::Tensor& acc_in, const at::Tensor& index_in, const c10::optional<at::Tensor>& residual,
                        const c10::optional<at::Tensor>& momentum, bool masking, const at::Tensor& values) {
  const typename Device::Guard guard(acc_in.device());
  check_candidates("send_selected", acc_in, index_in);
  const at::Tensor acc = acc_in.contiguous(), index = index_in.contiguous();
  const Feedback fb = send_feedback<Device>("send_selected", index, residual, momentum, masking);
  SC_DISPATCH_FLOAT_TYPES(values.scalar_type(), "send_selected", [&] {
    Device::template send_selected<scalar_t>(acc.data_ptr<float>(), index.data_ptr<int32_t>(), acc.numel(), fb,
                                             data_as<scalar_t>(values));
  });
}

template <typename Device>
at::Tensor send_selected(const at::Tensor& acc, const at::Tensor& index, const c10::optional<at::Tensor>& residual,
                         const c10::optional<at::Tensor>& momentum, bool masking, at::ScalarType dtype) {
  at::Tensor values = at::empty({acc.numel()}, acc.options().dtype(dtype));
  send_selected_into<Device>(acc, index, residual, momentum, masking, values);
  return values;
}

template <typename Device>
void unpack_into(const at::Tensor& values_in, const at::Tensor& index_in, UnpackScale scale, const at::Tensor& out) {
  const typename Device::Guard guard(out.device());
  check_unpack_args(values_in, index_in, out);
  const at::Tensor values = values_in.contiguous(), index = index_in.contiguous();
  Device::check_index_range("sparse_unpack", index, out.numel());
  SC_DISPATCH_FLOAT_TYPES(values.scalar_type(), "sparse_unpack",
                          [&] { Device::template sparse_unpack<scalar_t>(values, index, scale, out); });
}

template <typename Device>
void sparse_unpack_into(const at::Tensor& values, const at::Tensor& index, double scale, const at::Tensor& out) {
  unpack_into<Device>(values, index, UnpackScale(float(scale)), out);
}

template <typename Device>
at::Tensor sparse_unpack(const at::Tensor& values, const at::Tensor& index, int64_t numel, double scale) {
  TORCH_CHECK(numel >= 0, "sparse_unpack: numel should be >= 0, got ", numel);
  at::Tensor dense = at::empty({numel}, values.options());
  sparse_unpack_into<Device>(values, index, scale, dense);
  return dense;
}

// The state's pass with nothing selected (random-k before its gather): no candidates, so no
// output whose size depends on the data (on CUDA, no host synchronisation).
template <typename Device>
void accumulate(const at::Tensor& grad, const c10::optional<at::Tensor>& residual,
                const c10::optional<at::Tensor>& momentum, double momentum_factor) {
  const typename Device::Guard guard(grad.device());
  FeedbackArgs a("accumulate", grad, residual, momentum, momentum_factor, c10::nullopt);
  SC_DISPATCH_FLOAT_TYPES(a.grad.scalar_type(), "accumulate", [&] {
    Device::template accumulate<scalar_t>(data_as<scalar_t>(a.grad), a.fb, a.grad.numel());
  });
}

template <typename Device>
void momentum_step(const at::Tensor& grad, const at::Tensor& momentum, double momentum_factor,
                   const c10::optional<at::Tensor>& grad_scale, bool nesterov) {
  const typename Device::Guard guard(grad.device());
  TORCH_CHECK(grad.is_contiguous(), "momentum_step: grad should be contiguous (it is written in place)");
  FeedbackArgs a("momentum_step", grad, c10::nullopt, momentum, momentum_factor, grad_scale, nesterov);
  SC_DISPATCH_FLOAT_TYPES(a.grad.scalar_type(), "momentum_step", [&] {
    Device::template momentum_step<scalar_t>(data_as<scalar_t>(a.grad), a.fb, a.grad.numel(),
                                             data_as<scalar_t>(a.grad));
  });
}

// A gradient, its clipping limit and where its factor goes (clip_factors_into's).
struct ClipTensor {
  at::Tensor grad;
  double limit;
  at::Tensor factor;
};

// momentum_step of many gradients in one call (Device::momentum_many: on CUDA, one launch).
template <typename Device>
void momentum_step_many(at::TensorList grads, at::TensorList momenta, double momentum_factor,
                        const c10::List<c10::optional<at::Tensor>>& grad_scales, bool nesterov) {
  constexpr const char* op = "momentum_step_many";
  const size_t n = grads.size();
  TORCH_CHECK(momenta.size() == n && grad_scales.size() == n, op, ": momenta and grad_scales should hold one entry ",
              "per grad (", n, "), got ", momenta.size(), " and ", grad_scales.size());
  if (n == 0) return;
  const typename Device::Guard guard(grads[0].device());
  std::vector<FeedbackArgs> args;
  for (size_t p = 0; p < n; ++p) {
    TORCH_CHECK(grads[p].is_contiguous(), op, ": grads should be contiguous (they are written in place); grad ", p,
                " is not");
    TORCH_CHECK(grads[p].device() == grads[0].device(), op, ": grads should all be on one device, got ",
                grads[0].device(), " and ", grads[p].device());
    args.emplace_back(op, grads[p], c10::nullopt, momenta[p], momentum_factor, grad_scales[p], nesterov);
  }
  Device::momentum_many(args);
}

// The launchers take the tiles' scratch from torch's allocator (a double per 4,096 elements).
template <typename Device>
at::Tensor sum_of_squares(const at::Tensor& x_in) {
  const typename Device::Guard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor tile_sums = at::empty({square_tiles(x.numel())}, x.options().dtype(at::kDouble));
  at::Tensor out = at::empty({}, x.options().dtype(at::kDouble));
  SC_DISPATCH_FLOAT_TYPES(x.scalar_type(), "sum_of_squares", [&] {
    Device::template sum_of_squares<scalar_t>(data_as<scalar_t>(x), x.numel(), tile_sums.data_ptr<double>(),
                                              out.data_ptr<double>());
  });
  return out;
}

// DGC's clipping factors of many gradients in one call (Device::clip_factors: on CUDA, two
// launches): factors[p] (a 1-element float32 tensor on the gradients' device) = (1 / norm) *
// limits[p] where grads[p]'s norm (sum_of_squares, square-rooted in float64) is above limits[p],
// else 1 (the bits of torch's `limit / norm`, which multiplies by the reciprocal).
template <typename Device>
void clip_factors_into(at::TensorList grads, at::ArrayRef<double> limits, at::TensorList factors) {
  constexpr const char* op = "clip_factors_into";
  const size_t n = grads.size();
  TORCH_CHECK(limits.size() == n && factors.size() == n, op, ": limits and factors should hold one entry per grad (", n,
              "), got ", limits.size(), " and ", factors.size());
  if (n == 0) return;
  const typename Device::Guard guard(grads[0].device());
  std::vector<ClipTensor> clips;
  for (size_t p = 0; p < n; ++p) {
    TORCH_CHECK(grads[p].device() == grads[0].device() && factors[p].device() == grads[0].device(), op,
                ": grads and factors should all be on one device, got ", grads[p].device(), " and ",
                factors[p].device());
    TORCH_CHECK(factors[p].scalar_type() == at::kFloat && factors[p].numel() == 1, op,
                ": factors should be 1-element float32 tensors, got ", factors[p].numel(), " ",
                factors[p].scalar_type());
    clips.push_back({grads[p].contiguous(), limits[p], factors[p]});
  }
  Device::clip_factors(clips);
}

// The wire rows of sparsecomm/core/wire.py (kernels/wire.h): a marker row for each bucket, an
// element's uint16 offset in its bucket, then the bytes of its value. Built and split by one op
// each (Device::wire_rows, Device::wire_columns), not by a handful of Python-level torch calls
// (3-4 us each on a CPU) for every tensor.
inline void check_wire_value_dtype(const char* op, at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, op,
              ": values should be float32, float16 or bfloat16, got ", dtype);
}

// The send of [start, start + length) of a tensor: its selection's values and int32 indices,
// strictly ascending inside the range.
inline void check_send(const char* op, const at::Tensor& values, const at::Tensor& index, int64_t start,
                       int64_t length) {
  TORCH_CHECK(values.dim() == 1, op, ": values should be 1-D, got ", values.dim(), "-D");
  TORCH_CHECK(index.scalar_type() == at::kInt && index.dim() == 1, op, ": index should be a 1-D int32 tensor, got ",
              index.dim(), "-D ", index.scalar_type());
  TORCH_CHECK(values.numel() == index.numel(), op, ": values and index should have the same length, got ",
              values.numel(), " and ", index.numel());
  TORCH_CHECK(index.device() == values.device(), op, ": values and index should be on one device");
  TORCH_CHECK(start >= 0 && length >= 0 && start + length <= (int64_t(1) << 31), op,
              ": [start, start + length) should lie in [0, 2^31), got start ", start, ", length ", length);
  TORCH_CHECK(index.numel() <= length, op, ": ", index.numel(), " elements do not fit a range of ", length);
  check_wire_value_dtype(op, values.scalar_type());
}

// The rows' shape: [k + buckets, 2 + value bytes].
inline std::array<int64_t, 2> rows_shape(const at::Tensor& values, const at::Tensor& index, int64_t start,
                                         int64_t length) {
  return {index.numel() + wire_buckets(start, length), kWireOffsetBytes + int64_t(values.element_size())};
}

template <typename Device>
at::Tensor wire_rows(const at::Tensor& values, const at::Tensor& index, int64_t start, int64_t length) {
  const typename Device::Guard guard(values.device());
  check_send("wire_rows", values, index, start, length);
  at::Tensor rows = at::empty(rows_shape(values, index, start, length), values.options().dtype(at::kByte));
  Device::wire_rows(values.contiguous(), index.contiguous(), start, length, rows);
  return rows;
}

// The same rows written into `out` (uint8, contiguous, exactly their bytes): a DDP bucket's chunk
// takes them where they travel, with no tensor of their own and no copy.
template <typename Device>
void wire_rows_into(const at::Tensor& values, const at::Tensor& index, int64_t start, int64_t length,
                    const at::Tensor& out) {
  const typename Device::Guard guard(values.device());
  check_send("wire_rows_into", values, index, start, length);
  const auto shape = rows_shape(values, index, start, length);
  const int64_t bytes = shape[0] * shape[1];
  TORCH_CHECK(
      out.scalar_type() == at::kByte && out.is_contiguous() && out.numel() == bytes && out.device() == values.device(),
      "wire_rows_into: out should be a contiguous uint8 tensor of ", bytes, " bytes on values' device, got ",
      out.scalar_type(), " of ", out.numel(), " on ", out.device());
  Device::wire_rows(values.contiguous(), index.contiguous(), start, length, out);
}

// A send of [0, length) and where its rows go (wire_rows_many_into's), as pointers into the out
// chunk: a DDP bucket's sends are cut from it by arithmetic, not by a tensor op each. At fixed
// capacity (wire_rows_fixed_into's), `count` (an int64 on the chunk's device) says how many of
// values it sends, and its number of rows goes to `rows_count`.
struct WireSend {
  at::Tensor values, index;
  int64_t length;
  uint8_t* rows;
  const int64_t* count = nullptr;
  int64_t* rows_count = nullptr;
};

// wire_rows_into of many whole sends, written into one chunk: send p (of [0, places[2p + 1]))
// at byte places[2p] of out (uint8, contiguous, 1-D). A DDP bucket's rows cross from Python once.
template <typename Device>
void wire_rows_many_into(at::TensorList values, at::TensorList index, at::IntArrayRef places, const at::Tensor& out) {
  constexpr const char* op = "wire_rows_many_into";
  const size_t n = values.size();
  TORCH_CHECK(index.size() == n && places.size() == 2 * n, op, ": index should hold one tensor and places two ",
              "numbers (byte offset, length) per values, got ", n, " values, ", index.size(), " index and ",
              places.size(), " places");
  TORCH_CHECK(out.scalar_type() == at::kByte && out.dim() == 1 && out.is_contiguous(), op,
              ": out should be a contiguous 1-D uint8 tensor, got ", out.dim(), "-D ", out.scalar_type());
  const typename Device::Guard guard(out.device());
  std::vector<WireSend> sends;
  for (size_t p = 0; p < n; ++p) {
    const int64_t offset = places[2 * p], length = places[2 * p + 1];
    check_send(op, values[p], index[p], 0, length);
    TORCH_CHECK(values[p].device() == out.device(), op, ": values should be on out's device, got ", values[p].device(),
                " and ", out.device());
    const auto shape = rows_shape(values[p], index[p], 0, length);
    const int64_t bytes = shape[0] * shape[1];
    TORCH_CHECK(offset >= 0 && offset + bytes <= out.numel(), op, ": send ", p, "'s ", bytes, " bytes at ", offset,
                " do not fit out's ", out.numel());
    sends.push_back({values[p].contiguous(), index[p].contiguous(), length, out.data_ptr<uint8_t>() + offset});
  }
  Device::wire_rows_many(sends, out.device());
}

// A bucket's chunk (out) and its sends' counts on its device, as the fixed-capacity writers take
// them (wire_rows_fixed_into, quantize.h's quantized_segments_fixed_into).
inline void check_fixed_chunk(const char* op, const at::Tensor& counts, const at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == at::kByte && out.dim() == 1 && out.is_contiguous(), op,
              ": out should be a contiguous 1-D uint8 tensor, got ", out.dim(), "-D ", out.scalar_type());
  TORCH_CHECK(counts.scalar_type() == at::kLong && counts.dim() == 1 && counts.device() == out.device(), op,
              ": counts should be a 1-D int64 tensor on out's device, got ", counts.dim(), "-D ", counts.scalar_type(),
              " on ", counts.device());
}

// wire_rows_many_into of sends of fixed capacity: send p sends the first counts[p] of its values
// and index; places[3p..3p+2] = (the byte offset of its number of rows, written as an int64; of
// its rows, which have room for every element's; length). Nothing is read on the host.
template <typename Device>
void wire_rows_fixed_into(at::TensorList values, at::TensorList index, const at::Tensor& counts, at::IntArrayRef places,
                          const at::Tensor& out) {
  constexpr const char* op = "wire_rows_fixed_into";
  const size_t n = values.size();
  TORCH_CHECK(index.size() == n && places.size() == 3 * n && counts.numel() == int64_t(n), op,
              ": index and counts should hold one entry and places three numbers (count slot, byte offset, length) ",
              "per values, got ", n, " values, ", index.size(), " index, ", counts.numel(), " counts and ",
              places.size(), " places");
  check_fixed_chunk(op, counts, out);
  const typename Device::Guard guard(out.device());
  const at::Tensor all = counts.contiguous();
  std::vector<WireSend> sends;
  for (size_t p = 0; p < n; ++p) {
    const int64_t slot = places[3 * p], offset = places[3 * p + 1], length = places[3 * p + 2];
    check_send(op, values[p], index[p], 0, length);  // (its room: every element's rows fit)
    TORCH_CHECK(values[p].device() == out.device(), op, ": values should be on out's device, got ", values[p].device(),
                " and ", out.device());
    const auto shape = rows_shape(values[p], index[p], 0, length);
    const int64_t bytes = shape[0] * shape[1], count_bytes = int64_t(sizeof(int64_t));
    TORCH_CHECK(slot >= 0 && slot % count_bytes == 0 && slot + count_bytes <= offset && offset + bytes <= out.numel(),
                op, ": send ", p, "'s count slot at ", slot, " (8-byte aligned) and ", bytes, " bytes at ", offset,
                " should fit out's ", out.numel(), " in that order");
    sends.push_back({values[p].contiguous(), index[p].contiguous(), length, out.data_ptr<uint8_t>() + offset,
                     all.data_ptr<int64_t>() + p, reinterpret_cast<int64_t*>(out.data_ptr<uint8_t>() + slot)});
  }
  Device::wire_rows_many(sends, out.device());
}

inline void check_wire_rows(const char* op, const at::Tensor& rows, at::ScalarType value_dtype) {
  check_wire_value_dtype(op, value_dtype);
  const int64_t width = kWireOffsetBytes + c10::elementSize(value_dtype);
  TORCH_CHECK(rows.scalar_type() == at::kByte && rows.dim() == 2 && rows.size(1) == width, op,
              ": rows should be a 2-D uint8 tensor of ", width, " columns (a uint16 offset, then a ", value_dtype,
              " value), got ", rows.dim(), "-D ", rows.scalar_type(), " of shape ", rows.sizes());
}

// The elements of wire rows whose values are `value_dtype`: (values, index int32), in order.
template <typename Device>
std::tuple<at::Tensor, at::Tensor> wire_columns(const at::Tensor& rows, at::ScalarType value_dtype) {
  const typename Device::Guard guard(rows.device());
  check_wire_rows("wire_columns", rows, value_dtype);
  return Device::wire_columns(rows.contiguous(), value_dtype, /*exact=*/true);
}

// The elements of wire rows, their values cast to out's dtype, unpacked into out (the markers,
// read as -0.0 where not dropped, add nothing).
template <typename Device>
void unpack_rows(const at::Tensor& rows, at::ScalarType value_dtype, UnpackScale factor, const at::Tensor& out) {
  const auto [values, index] = Device::wire_columns(rows, value_dtype, /*exact=*/false);
  unpack_into<Device>(values.to(out.scalar_type()), index, factor, out);
}

// sparse_unpack_into of gathered wire rows (each rank's, in rank order), their values cast to
// out's dtype, the sums scaled by scale / divisor (unpack_scale).
template <typename Device>
void sparse_unpack_rows_into(const at::Tensor& rows, at::ScalarType value_dtype, const at::Tensor& scale,
                             int64_t divisor, const at::Tensor& out) {
  const UnpackScale factor = unpack_scale("sparse_unpack_rows", scale, divisor, out);
  const typename Device::Guard guard(rows.device());
  check_wire_rows("sparse_unpack_rows", rows, value_dtype);
  unpack_rows<Device>(rows.contiguous(), value_dtype, factor, out);
}

// sparse_unpack_rows_into of many tensors' gathered rows at once (a DDP bucket's): each row of
// `gathered` is one rank's chunk, which starts with a header of row counts (int64) and holds tensor
// p's rows in a region: regions[3p..3p+2] = (its count's slot in the header, byte offset, bytes).
// The counts are read where the op runs (Device::unpack_gathered_rows): on a GPU the host waits
// for nothing.
template <typename Device>
void sparse_unpack_gathered_rows_into(const at::Tensor& gathered, at::IntArrayRef regions, at::ScalarType value_dtype,
                                      const at::Tensor& scale, int64_t divisor, at::TensorList outs) {
  constexpr const char* op = "sparse_unpack_gathered_rows";
  if (outs.empty()) return;
  const UnpackScale factor = unpack_scale(op, scale, divisor, outs[0]);
  const typename Device::Guard guard(gathered.device());
  check_wire_value_dtype(op, value_dtype);
  TORCH_CHECK(gathered.scalar_type() == at::kByte && gathered.dim() == 2, op,
              ": gathered should be a 2-D uint8 tensor (a rank's chunk per row), got ", gathered.dim(), "-D ",
              gathered.scalar_type());
  const int64_t params = int64_t(outs.size()), chunk = gathered.size(1), count_bytes = int64_t(sizeof(int64_t));
  TORCH_CHECK(int64_t(regions.size()) == 3 * params, op, ": regions should hold 3 numbers (count slot, byte ",
              "offset, bytes) for each of the ", params, " outs, got ", regions.size());
  for (int64_t p = 0; p < params; ++p) {
    const int64_t slot = regions[3 * p], at = regions[3 * p + 1], bytes = regions[3 * p + 2];
    TORCH_CHECK(slot >= 0 && (slot + 1) * count_bytes <= at && bytes >= 0 && at + bytes <= chunk, op, ": region ", p,
                " (count slot ", slot, ", bytes [", at, ", ", at + bytes, ")) should come after its count and lie ",
                "inside a chunk of ", chunk, " bytes");
    const at::Tensor& out = outs[p];
    TORCH_CHECK(out.is_contiguous() && out.scalar_type() == outs[0].scalar_type() && out.device() == gathered.device(),
                op, ": outs should be contiguous, of one dtype and on gathered's device; out ", p, " is ",
                out.scalar_type(), " on ", out.device());
  }
  const int64_t width = kWireOffsetBytes + c10::elementSize(value_dtype);
  Device::unpack_gathered_rows(gathered.contiguous(), regions, width, value_dtype, factor, outs);
}

template <typename Device>
at::Tensor random_k_indices(const at::Tensor& like, int64_t seed, int64_t tensor_id, int64_t step, int64_t k) {
  const typename Device::Guard guard(like.device());
  const Permutation perm = checked_permutation(like.numel(), k, seed, tensor_id, step);
  return Device::random_k_indices(perm, k, at::empty({k}, like.options().dtype(at::kInt)));
}

// The sampled packs of sparsecomm/core/packing.py (pack_sampled, and pack_topk's top_candidates)
// of many tensors in one call, each as those compose it for one tensor, through the same op
// bodies: the same bits, without Python and the dispatcher between the steps of every tensor.
// plans[kPackPlan * p ..] = (k, sample_count, too_few, too_many, tensor_id, step): the threshold
// sampled at ratios[p] (none when sample_count is 0: every element is a candidate, or none for
// k = 0), then k exactly where the count is above too_many (the candidates' top k) or below
// too_few (every element's, a second read-only pass), the send in value_dtype (None: grad's).
constexpr int64_t kPackPlan = 6;

// One tensor of pack_sampled_many, on the host: its arguments, its plan, its threshold's sample
// (count 0: none, the threshold is `fixed`) and the dtype of its send.
struct SampledTensor {
  const int64_t* plan;  // kPackPlan numbers
  c10::optional<at::Tensor> residual, momentum;
  FeedbackArgs args;
  SamplePlan sample;
  float fixed;
  at::ScalarType value_dtype;
};

inline SampledTensor sampled_tensor(const char* op, const at::Tensor& grad, c10::optional<at::Tensor> residual,
                                    c10::optional<at::Tensor> momentum, double momentum_factor,
                                    const c10::optional<at::Tensor>& grad_scale, bool nesterov, double ratio,
                                    const int64_t* plan, int64_t seed, c10::optional<at::ScalarType> value_dtype) {
  const int64_t k = plan[0], sample_count = plan[1];
  FeedbackArgs a = candidate_args(op, grad, residual, momentum, momentum_factor, grad_scale, nesterov);
  const SamplePlan sample = sample_count > 0
                                ? checked_sample_plan(a.grad.numel(), ratio, sample_count, seed, plan[4], plan[5])
                                : SamplePlan();
  const float fixed = sample_count == 0 && k > 0 ? 0.0f : INFINITY;  // (every element, or none for k = 0)
  return {plan,
          std::move(residual),
          std::move(momentum),
          std::move(a),
          sample,
          fixed,
          value_dtype.value_or(grad.scalar_type())};
}

// Where a tensor's candidate count falls against its band [too_few, too_many]: above, its top k
// of the candidates; inside, the candidates as they are; below, its top k of every element.
enum class Band { kAbove, kInside, kBelow };
inline Band band_of(const SampledTensor& t, int64_t count) {
  return count > t.plan[3] ? Band::kAbove : count >= t.plan[2] ? Band::kInside : Band::kBelow;
}

// The most a tensor's selection holds, whatever its count: k, or its band's top (pack_sampled_fixed).
inline int64_t capacity_of(const SampledTensor& t) {
  return std::min(t.args.grad.numel(), std::max(t.plan[0], t.plan[3]));
}

// The top k of every element's acc, in a second, read-only pass (a tensor below its band).
template <typename Device>
std::tuple<at::Tensor, at::Tensor> every_element_top(const SampledTensor& t) {
  const at::Tensor& every = t.residual ? *t.residual : t.momentum ? *t.momentum : t.args.grad;
  const at::Tensor zero = at::scalar_tensor(0.0, every.options().dtype(at::kFloat));
  auto [acc, index] = accumulate_candidates<Device>(every, c10::nullopt, c10::nullopt, 0.0, zero, c10::nullopt, false);
  return select_top<Device>(acc, index, t.plan[0]);
}

// The top k of each of many candidate lists (Device::select_top_many's input).
struct TopOf {
  at::Tensor acc, index;
  int64_t k;
};

// Each tensor's selection: its candidates, banded (the tensors above their band together).
template <typename Device>
std::vector<std::tuple<at::Tensor, at::Tensor>> banded(const std::vector<SampledTensor>& tensors,
                                                       std::vector<std::tuple<at::Tensor, at::Tensor>> candidates,
                                                       const std::vector<int64_t>& counts) {
  std::vector<TopOf> above;
  std::vector<size_t> above_at;
  for (size_t p = 0; p < tensors.size(); ++p) {
    const Band band = band_of(tensors[p], counts[p]);
    if (band == Band::kBelow) candidates[p] = every_element_top<Device>(tensors[p]);
    if (band != Band::kAbove) continue;
    above.push_back({std::get<0>(candidates[p]), std::get<1>(candidates[p]), tensors[p].plan[0]});
    above_at.push_back(p);
  }
  const auto tops = Device::select_top_many(above);
  for (size_t j = 0; j < above_at.size(); ++j) candidates[above_at[j]] = tops[j];
  return candidates;
}

// A bucket's selections at fixed capacity (pack_sampled_fixed, and quantize.h's pack_quantized_fixed):
// each tensor's values (quantized: its codes) and index have the room of its capacity_of, and counts
// (int64, on their device) says how many are sent. Quantized, each tensor's scales too.
struct PackedFixed {
  std::vector<at::Tensor> values, indices, scales;
  at::Tensor counts;
};

// The bucket's phases, each over all its tensors (Device::count_bucket, bucket_totals,
// bucket_candidates, select_top_many, send_bucket; on CUDA, each a fixed number of launches): the
// thresholds and the state pass with the candidates counted, one read of all the counts (on CUDA,
// the only synchronisation but a too-few tensor's second pass), the candidates, each tensor's
// band, the sends.
template <typename Device>
std::vector<std::tuple<at::Tensor, at::Tensor>> selections(const std::vector<SampledTensor>& tensors) {
  const typename Device::Bucket bucket = Device::count_bucket(tensors);
  const std::vector<int64_t> counts = Device::bucket_totals(bucket);
  return banded<Device>(tensors, Device::bucket_candidates(bucket, tensors, counts), counts);
}
template <typename Device>
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> pack_tensors(const std::vector<SampledTensor>& tensors,
                                                                          bool masking) {
  std::vector<at::Tensor> accs, indices;
  for (auto& [acc, index] : selections<Device>(tensors)) {
    accs.push_back(acc);
    indices.push_back(index);
  }
  return {Device::send_bucket(tensors, accs, indices, masking), indices};
}

// A bucket's phases tensor by tensor (the CPU policy's, by inheritance: CpuDevice): each tensor's
// candidates are complete after its pass, so the totals are their lengths.
template <typename Device>
struct TensorByTensor {
  using Bucket = std::vector<std::tuple<at::Tensor, at::Tensor>>;
  static Bucket count_bucket(const std::vector<SampledTensor>& tensors) {
    Bucket bucket;
    for (const SampledTensor& t : tensors)
      bucket.push_back(SC_DISPATCH_FLOAT_TYPES(t.args.grad.scalar_type(), "pack_sampled_many", [&] {
        const at::Tensor threshold = t.sample.count > 0 ? Device::template sample_threshold<scalar_t>(t.args, t.sample)
                                                        : at::scalar_tensor(t.fixed, at::kFloat);
        return Device::template accumulate_candidates<scalar_t>(t.args, threshold);
      }));
    return bucket;
  }
  static std::vector<int64_t> bucket_totals(const Bucket& bucket) {
    std::vector<int64_t> totals;
    for (const auto& candidates : bucket) totals.push_back(std::get<0>(candidates).numel());
    return totals;
  }
  static const Bucket& bucket_candidates(const Bucket& bucket, const std::vector<SampledTensor>&,
                                         const std::vector<int64_t>&) {
    return bucket;
  }
  static std::vector<at::Tensor> send_bucket(const std::vector<SampledTensor>& tensors,
                                             const std::vector<at::Tensor>& accs,
                                             const std::vector<at::Tensor>& indices, bool masking) {
    std::vector<at::Tensor> values;
    for (size_t p = 0; p < tensors.size(); ++p)
      values.push_back(send_selected<Device>(accs[p], indices[p], tensors[p].residual, tensors[p].momentum, masking,
                                             tensors[p].value_dtype));
    return values;
  }
  // The bucket at fixed capacity: its packs as pack_tensors makes them, each sent straight into
  // the room of its capacity (capacity_of), and their counts. bits (1 or 2): sent by send_quantized
  // (its codes have the room's bytes), else by send_selected.
  static PackedFixed pack_fixed(const std::vector<SampledTensor>& tensors, bool masking, int bits = 0) {
    const auto chosen = selections<Device>(tensors);
    PackedFixed fixed;
    std::vector<int64_t> counts;
    for (size_t p = 0; p < tensors.size(); ++p) {
      const SampledTensor& t = tensors[p];
      const auto& [acc, index] = chosen[p];
      const int64_t room = capacity_of(t), count = index.numel();
      TORCH_CHECK(count <= room, "pack_sampled_fixed: ", count, " selected, past the capacity of ", room);
      fixed.indices.push_back(at::empty({room}, index.options()));
      if (count > 0)
        std::memcpy(fixed.indices.back().data_ptr(), index.contiguous().data_ptr(), count * sizeof(int32_t));
      if (bits > 0) {
        fixed.values.push_back(at::empty({quantized_bytes(room, bits)}, acc.options().dtype(at::kByte)));
        fixed.scales.push_back(at::empty({quantized_scales(bits)}, acc.options()));
        const Feedback fb = send_feedback<Device>("pack_quantized_fixed", index, t.residual, t.momentum, masking);
        Device::send_quantized(data_as<float>(acc.contiguous()), data_as<int32_t>(index.contiguous()), count, fb, bits,
                               data_as<uint8_t>(fixed.values.back()), data_as<float>(fixed.scales.back()));
      } else {
        fixed.values.push_back(at::empty({room}, t.args.grad.options().dtype(t.value_dtype)));
        send_selected_into<Device>(acc, index, t.residual, t.momentum, masking, fixed.values.back());
      }
      counts.push_back(count);
    }
    fixed.counts = at::tensor(counts, at::TensorOptions().dtype(at::kLong));
    return fixed;
  }
  static void clip_factors(const std::vector<ClipTensor>& clips) {
    for (const ClipTensor& c : clips) {
      const at::Tensor norm = sum_of_squares<Device>(c.grad).sqrt();
      const at::Tensor factor = at::where(norm > c.limit, norm.reciprocal().mul(c.limit), 1.0);
      c.factor.copy_(factor.to(at::kFloat).reshape(c.factor.sizes()));
    }
  }
  static void momentum_many(const std::vector<FeedbackArgs>& grads) {
    for (const FeedbackArgs& a : grads)
      SC_DISPATCH_FLOAT_TYPES(a.grad.scalar_type(), "momentum_step_many", [&] {
        Device::template momentum_step<scalar_t>(data_as<scalar_t>(a.grad), a.fb, a.grad.numel(),
                                                 data_as<scalar_t>(a.grad));
      });
  }
};

// pack_sampled_many's and pack_sampled_fixed's arguments (op: the name their errors give): their
// lengths checked first, then, under the grads' device guard, each tensor as a SampledTensor.
inline void check_sampled_lengths(const char* op, size_t n, const c10::List<c10::optional<at::Tensor>>& residuals,
                                  const c10::List<c10::optional<at::Tensor>>& momenta,
                                  const c10::List<c10::optional<at::Tensor>>& grad_scales, at::ArrayRef<double> ratios,
                                  at::IntArrayRef plans) {
  TORCH_CHECK(residuals.size() == n && momenta.size() == n && grad_scales.size() == n && ratios.size() == n, op,
              ": residuals, momenta, grad_scales and ratios should hold one entry per grad (", n, "), got ",
              residuals.size(), ", ", momenta.size(), ", ", grad_scales.size(), " and ", ratios.size());
  TORCH_CHECK(int64_t(plans.size()) == kPackPlan * int64_t(n), op, ": plans should hold ", kPackPlan,
              " numbers (k, sample_count, too_few, too_many, tensor_id, step) per grad, got ", plans.size(), " for ", n,
              " grads");
}
inline std::vector<SampledTensor> sampled_tensors(const char* op, at::TensorList grads,
                                                  const c10::List<c10::optional<at::Tensor>>& residuals,
                                                  const c10::List<c10::optional<at::Tensor>>& momenta,
                                                  double momentum_factor,
                                                  const c10::List<c10::optional<at::Tensor>>& grad_scales,
                                                  bool nesterov, at::ArrayRef<double> ratios, at::IntArrayRef plans,
                                                  int64_t seed, c10::optional<at::ScalarType> value_dtype) {
  std::vector<SampledTensor> tensors;
  for (size_t p = 0; p < grads.size(); ++p) {
    TORCH_CHECK(grads[p].device() == grads[0].device(), op, ": grads should all be on one device, got ",
                grads[0].device(), " and ", grads[p].device());
    tensors.push_back(sampled_tensor(op, grads[p], residuals[p], momenta[p], momentum_factor, grad_scales[p], nesterov,
                                     ratios[p], plans.data() + kPackPlan * p, seed, value_dtype));
  }
  return tensors;
}

template <typename Device>
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> pack_sampled_many(
    at::TensorList grads, const c10::List<c10::optional<at::Tensor>>& residuals,
    const c10::List<c10::optional<at::Tensor>>& momenta, double momentum_factor,
    const c10::List<c10::optional<at::Tensor>>& grad_scales, bool nesterov, bool masking, at::ArrayRef<double> ratios,
    at::IntArrayRef plans, int64_t seed, c10::optional<at::ScalarType> value_dtype) {
  constexpr const char* op = "pack_sampled_many";
  check_sampled_lengths(op, grads.size(), residuals, momenta, grad_scales, ratios, plans);
  if (grads.empty()) return {};
  const typename Device::Guard guard(grads[0].device());
  return pack_tensors<Device>(sampled_tensors(op, grads, residuals, momenta, momentum_factor, grad_scales, nesterov,
                                              ratios, plans, seed, value_dtype),
                              masking);
}

// pack_sampled_many at fixed capacity: (values, index, counts), tensor p's selection the first
// counts[p] of its values and index (each capacity_of long; what lies past them is unspecified).
// On CUDA the host reads nothing (Device::pack_fixed).
template <typename Device>
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, at::Tensor> pack_sampled_fixed(
    at::TensorList grads, const c10::List<c10::optional<at::Tensor>>& residuals,
    const c10::List<c10::optional<at::Tensor>>& momenta, double momentum_factor,
    const c10::List<c10::optional<at::Tensor>>& grad_scales, bool nesterov, bool masking, at::ArrayRef<double> ratios,
    at::IntArrayRef plans, int64_t seed, c10::optional<at::ScalarType> value_dtype) {
  constexpr const char* op = "pack_sampled_fixed";
  check_sampled_lengths(op, grads.size(), residuals, momenta, grad_scales, ratios, plans);
  if (grads.empty()) return {{}, {}, at::empty({0}, at::kLong)};
  const typename Device::Guard guard(grads[0].device());
  PackedFixed fixed = Device::pack_fixed(sampled_tensors(op, grads, residuals, momenta, momentum_factor, grad_scales,
                                                         nesterov, ratios, plans, seed, value_dtype),
                                         masking);
  return {std::move(fixed.values), std::move(fixed.indices), fixed.counts.to(grads[0].device())};
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
  m.impl("accumulate", &accumulate<Device>);
  m.impl("momentum_step", &momentum_step<Device>);
  m.impl("momentum_step_many", &momentum_step_many<Device>);
  m.impl("clip_factors_into", &clip_factors_into<Device>);
  m.impl("sum_of_squares", &sum_of_squares<Device>);
  m.impl("wire_rows", &wire_rows<Device>);
  m.impl("wire_rows_into", &wire_rows_into<Device>);
  m.impl("wire_rows_many_into", &wire_rows_many_into<Device>);
  m.impl("wire_columns", &wire_columns<Device>);
  m.impl("sparse_unpack_rows_into", &sparse_unpack_rows_into<Device>);
  m.impl("sparse_unpack_gathered_rows_into", &sparse_unpack_gathered_rows_into<Device>);
  m.impl("pack_sampled_many", &pack_sampled_many<Device>);
  m.impl("pack_sampled_fixed", &pack_sampled_fixed<Device>);
  m.impl("wire_rows_fixed_into", &wire_rows_fixed_into<Device>);
}

}  // namespace torch_binding
}  // namespace sparsecomm
