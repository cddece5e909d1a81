// The sparsecomm op namespace: every schema in one place. Device implementations are
// registered beside their launchers' bindings (cpu.cpp, cuda.cpp); shape-only Meta
// implementations here make the ops traceable (torch.compile, opcheck).
#include <Python.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include "../kernels/philox.h"

// `import sparsecomm._C` loads this library, which registers the ops below.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}

namespace sparsecomm {
namespace {

int64_t random_block_start_op(int64_t seed, int64_t tensor_id, int64_t step, int64_t numel) {
  TORCH_CHECK(numel >= 0, "random_block_start: numel should be >= 0, got ", numel);
  TORCH_CHECK(tensor_id >= 0 && tensor_id <= 0xffffffffLL,
              "random_block_start: tensor_id should be a uint32, got ", tensor_id);
  TORCH_CHECK(step >= 0, "random_block_start: step should be >= 0, got ", step);
  return random_block_start(uint64_t(seed), uint32_t(tensor_id), uint64_t(step), numel);
}

at::Tensor block_pack_meta(const at::Tensor& grad, const c10::optional<at::Tensor>&, int64_t, int64_t length) {
  return at::empty({length}, grad.options());
}

at::Tensor block_unpack_meta(const at::Tensor& values, int64_t numel, int64_t, double) {
  return at::empty({numel}, values.options());
}

at::Tensor sample_threshold_meta(const at::Tensor& grad, const c10::optional<at::Tensor>&,
                                 const c10::optional<at::Tensor>&, double, double, int64_t, int64_t, int64_t,
                                 int64_t) {
  return at::empty({}, grad.options().dtype(at::kFloat));
}

at::Tensor send_selected_meta(const at::Tensor& acc, const at::Tensor&, const c10::optional<at::Tensor>&,
                              const c10::optional<at::Tensor>&, bool, at::ScalarType dtype) {
  return at::empty_like(acc, acc.options().dtype(dtype));
}

std::tuple<at::Tensor, at::Tensor> send_quantized_meta(const at::Tensor& acc, const at::Tensor&,
                                                       const c10::optional<at::Tensor>&,
                                                       const c10::optional<at::Tensor>&, bool, int64_t bits) {
  return {at::empty_symint({(acc.sym_numel() * bits + 7) / 8}, acc.options().dtype(at::kByte)),
          at::empty({bits == 1 ? 2 : 4}, acc.options())};
}

at::Tensor dequantize_meta(const at::Tensor& codes, const at::Tensor&, int64_t count, int64_t) {
  return at::empty({count}, codes.options().dtype(at::kFloat));
}

at::Tensor random_k_indices_meta(const at::Tensor& like, int64_t, int64_t, int64_t, int64_t k) {
  return at::empty({k}, like.options().dtype(at::kInt));
}

at::Tensor sparse_unpack_meta(const at::Tensor& values, const at::Tensor&, int64_t numel, double) {
  return at::empty({numel}, values.options());
}

}  // namespace

TORCH_LIBRARY(sparsecomm, m) {
  // The start of the cyclic random block of a tensor at a step: Philox4x32-10 selection stream.
  m.def("random_block_start(int seed, int tensor_id, int step, int numel) -> int", &random_block_start_op);
  // Error-feedback pack of the cyclic block [start, start+length) of grad (flattened).
  // Returns the block's values in grad's dtype; updates residual (float32) in place.
  m.def("block_pack(Tensor grad, Tensor(a!)? residual, int start, int length) -> Tensor");
  // Dense tensor of numel elements: scale * values in the block, zero elsewhere.
  m.def("block_unpack(Tensor values, int numel, int start, float scale) -> Tensor");

  // Selection with error feedback (csrc/kernels/feedback.h): acc = residual + (m * momentum + grad).
  // The magnitude threshold (0-d float32) such that about `ratio` of a strided sample of |acc|
  // passes (rank ceil(ratio * count) of sample_count positions; csrc/kernels/sample.h).
  m.def("sample_threshold(Tensor grad, Tensor? residual, Tensor? momentum, float momentum_factor, float ratio, "
        "int sample_count, int seed, int tensor_id, int step) -> Tensor");
  // One pass: residual <- acc, momentum <- m * momentum + grad for every element; returns the
  // candidates |acc| >= threshold (NaN included) as (acc float32, index int32) in index order.
  m.def("accumulate_candidates(Tensor grad, Tensor(a!)? residual, Tensor(b!)? momentum, float momentum_factor, "
        "Tensor threshold) -> (Tensor, Tensor)");
  // The k candidates of largest |acc| (ties: lower index), in index order.
  m.def("select_top(Tensor acc, Tensor index, int k) -> (Tensor, Tensor)");
  // Sends the selected candidates as `dtype` values; their residual keeps only the rounding
  // error, their momentum is zeroed when masking.
  m.def("send_selected(Tensor acc, Tensor index, Tensor(a!)? residual, Tensor(b!)? momentum, bool masking, "
        "ScalarType dtype) -> Tensor");
  // send_selected quantized to 1 or 2 bits with per-tensor scales (csrc/kernels/quantize.h):
  // (codes uint8, packed; scales float32); the quantization error stays in the residual.
  m.def("send_quantized(Tensor acc, Tensor index, Tensor(a!)? residual, Tensor(b!)? momentum, bool masking, "
        "int bits) -> (Tensor, Tensor)");
  // The float32 values of `count` codes.
  m.def("dequantize(Tensor codes, Tensor scales, int count, int bits) -> Tensor");
  // k distinct indices of [0, like.numel()) from (seed, tensor_id, step), sorted, int32 on
  // like's device: the same on every rank (csrc/kernels/permutation.h).
  m.def("random_k_indices(Tensor like, int seed, int tensor_id, int step, int k) -> Tensor");
  // Dense tensor of numel elements: scale * (sum of values at each index); duplicates add.
  m.def("sparse_unpack(Tensor values, Tensor index, int numel, float scale) -> Tensor");
  // The same into an existing buffer (e.g. the gradient itself): no allocation, no page faults.
  m.def("sparse_unpack_into(Tensor values, Tensor index, float scale, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(sparsecomm, Meta, m) {
  m.impl("block_pack", &block_pack_meta);
  m.impl("block_unpack", &block_unpack_meta);
  m.impl("sample_threshold", &sample_threshold_meta);
  m.impl("send_selected", &send_selected_meta);
  m.impl("sparse_unpack", &sparse_unpack_meta);
  m.impl("random_k_indices", &random_k_indices_meta);
  m.impl("send_quantized", &send_quantized_meta);
  m.impl("dequantize", &dequantize_meta);
  // accumulate_candidates and select_top have data-dependent sizes: their fakes are
  // registered in Python (sparsecomm/torch/ops.py).
}

}  // namespace sparsecomm
