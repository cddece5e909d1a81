// The sparsecomm op namespace: every schema in one place. The op bodies are in block.h,
// select.h and quantize.h, registered per device by cpu.cpp and cuda.cpp; the fake (shape-only)
// kernels that make the ops traceable (torch.compile, opcheck) are in sparsecomm/torch/fakes.py.
#include <Python.h>
#include <torch/library.h>

#include "block.h"

// `import sparsecomm._C` loads this library, which registers the ops below.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}

namespace sparsecomm {

// The emulated CUDA test build (tests/cuda_emulation/torch_binding.cpp) defines these schemas
// again under its own namespace; every other build uses this default.
#ifndef SC_TORCH_LIBRARY
#define SC_TORCH_LIBRARY TORCH_LIBRARY(sparsecomm, m)
#endif

SC_TORCH_LIBRARY {
  // The start of the cyclic random block of a tensor at a step: Philox4x32-10 selection stream.
  m.def("random_block_start(int seed, int tensor_id, int step, int numel) -> int", &torch_binding::random_block_start);
  // Error-feedback pack of the cyclic block [start, start+length) of grad (flattened).
  // Returns the block's values in grad's dtype; updates residual (float32) in place.
  m.def("block_pack(Tensor grad, Tensor(a!)? residual, int start, int length) -> Tensor");
  // Dense tensor of numel elements: scale * values in the block, zero elsewhere.
  m.def("block_unpack(Tensor values, int numel, int start, float scale) -> Tensor");
  // The same into an existing buffer (the gradient itself): every element written, one pass.
  m.def("block_unpack_into(Tensor values, int start, float scale, Tensor(a!) out) -> ()");

  // Selection with error feedback (csrc/kernels/feedback.h): acc = residual + (m * momentum + grad);
  // nesterov (with a momentum): momentum <- m * (momentum + grad), acc = (residual + momentum) + grad.
  // grad_scale (sample_threshold, accumulate_candidates, momentum_step): a 1-element float32
  // tensor on grad's device that grad is read times, rounded once to its dtype (DGC's clipping
  // factor, not read by the host).
  // The magnitude threshold (0-d float32) such that about `ratio` of a strided sample of |acc|
  // passes (rank ceil(ratio * count) of sample_count positions; csrc/kernels/sample.h).
  m.def(
      "sample_threshold(Tensor grad, Tensor? residual, Tensor? momentum, float momentum_factor, float ratio, "
      "int sample_count, int seed, int tensor_id, int step, Tensor? grad_scale=None, bool nesterov=False) -> Tensor");
  // One pass: residual <- acc, momentum <- m * momentum + grad for every element; returns the
  // candidates |acc| >= threshold (NaN included) as (acc float32, index int32) in index order.
  m.def(
      "accumulate_candidates(Tensor grad, Tensor(a!)? residual, Tensor(b!)? momentum, float momentum_factor, "
      "Tensor threshold, Tensor? grad_scale=None, bool nesterov=False) -> (Tensor, Tensor)");
  // The same pass with nothing selected: the state takes acc for every element.
  m.def("accumulate(Tensor grad, Tensor(a!)? residual, Tensor(b!)? momentum, float momentum_factor) -> ()");
  // The k candidates of largest |acc| (ties: lower index), in index order.
  m.def("select_top(Tensor acc, Tensor index, int k) -> (Tensor, Tensor)");
  // Sends the selected candidates as `dtype` values; their residual keeps only the rounding
  // error, their momentum is zeroed when masking.
  m.def(
      "send_selected(Tensor acc, Tensor index, Tensor(a!)? residual, Tensor(b!)? momentum, bool masking, "
      "ScalarType dtype) -> Tensor");
  // send_selected quantized to 1 or 2 bits with per-tensor scales (csrc/kernels/quantize.h):
  // (codes uint8, packed; scales float32); the quantization error stays in the residual.
  m.def(
      "send_quantized(Tensor acc, Tensor index, Tensor(a!)? residual, Tensor(b!)? momentum, bool masking, "
      "int bits) -> (Tensor, Tensor)");
  // The float32 values of `count` codes.
  m.def("dequantize(Tensor codes, Tensor scales, int count, int bits) -> Tensor");
  // One rank's 1-/2-bit segment of sparsecomm/core/wire.py (uint8) of a tensor of numel elements:
  // count, scales, bucket counts, offsets, codes.
  m.def("quantized_segment(Tensor codes, Tensor scales, Tensor index, int bits, int numel) -> Tensor");
  // sparse_unpack_into of every rank's segment, gathered in rank order (values cast to out's
  // dtype), the sums scaled by scale[0] / divisor: a factor the host need not read (scale: a
  // 1-element float32 tensor on out's device, such as Horovod's reduced placeholder).
  m.def(
      "sparse_unpack_segments_into(Tensor gathered, int bits, int ranks, Tensor scale, int divisor, "
      "Tensor(a!) out) -> ()");
  // k distinct indices of [0, like.numel()) from (seed, tensor_id, step), sorted, int32 on
  // like's device: the same on every rank (csrc/kernels/permutation.h).
  m.def("random_k_indices(Tensor like, int seed, int tensor_id, int step, int k) -> Tensor");
  // Dense tensor of numel elements: scale * (sum of values at each index); duplicates add.
  m.def("sparse_unpack(Tensor values, Tensor index, int numel, float scale) -> Tensor");
  // The same into an existing buffer (e.g. the gradient itself): no allocation, no page faults.
  m.def("sparse_unpack_into(Tensor values, Tensor index, float scale, Tensor(a!) out) -> ()");
  // DGC's dense route, one pass: momentum <- m * momentum + grad, and grad <- that (rounded to its
  // dtype); with nesterov, momentum <- m * (momentum + grad) and grad <- momentum + grad.
  m.def(
      "momentum_step(Tensor(a!) grad, Tensor(b!) momentum, float momentum_factor, Tensor? grad_scale=None, "
      "bool nesterov=False) -> ()");
  // momentum_step of many gradients (each its own dtype, momentum and grad_scale) in one call: a DDP
  // bucket's dense route under DGC.
  m.def(
      "momentum_step_many(Tensor(a!)[] grads, Tensor(b!)[] momenta, float momentum_factor, Tensor?[] grad_scales, "
      "bool nesterov=False) -> ()");
  // DGC's clipping factors of many gradients: factors[p] (1-element float32, on grads[p]'s device) =
  // limits[p] / norm where grads[p]'s norm (sum_of_squares, square-rooted) is above it, else 1.
  m.def("clip_factors_into(Tensor[] grads, float[] limits, Tensor(a!)[] factors) -> ()");
  // The sum of the squares of x (float32, float16 or bfloat16) as a 0-d float64 tensor on x's
  // device, in one read of x and in a fixed order (csrc/kernels/squares.h): DGC's clipping norm
  // squared, without a float32 copy of a 16-bit gradient.
  m.def("sum_of_squares(Tensor x) -> Tensor");
  // The wire rows of sparsecomm/core/wire.py of a send of [start, start + length) (index int32,
  // strictly ascending in it), uint8 [k + buckets, 2 + value bytes]: a marker row for each
  // bucket, then each element's uint16 offset in its bucket and its value's bytes.
  m.def("wire_rows(Tensor values, Tensor index, int start, int length) -> Tensor");
  // The same rows written into out (uint8, contiguous, exactly their bytes): where they travel.
  m.def("wire_rows_into(Tensor values, Tensor index, int start, int length, Tensor(a!) out) -> ()");
  // wire_rows_into of many whole sends into one uint8 chunk: send p's rows (of [0, places[2p + 1]))
  // at its byte offset places[2p].
  m.def("wire_rows_many_into(Tensor[] values, Tensor[] index, int[] places, Tensor(a!) out) -> ()");
  // The elements of wire rows whose values are `value_dtype`: (values, index int32), in order.
  m.def("wire_columns(Tensor rows, ScalarType value_dtype) -> (Tensor, Tensor)");
  // sparse_unpack_into of gathered wire rows whose values are `value_dtype` (cast to out's
  // dtype), the sums scaled by scale[0] / divisor, as sparse_unpack_segments_into's.
  m.def(
      "sparse_unpack_rows_into(Tensor rows, ScalarType value_dtype, Tensor scale, int divisor, "
      "Tensor(a!) out) -> ()");
  // sparse_unpack_rows_into of many tensors at once: each row of `gathered` is a rank's chunk, a
  // header of row counts (int64), then tensor p's rows in a region, regions[3p..3p+2] = (its
  // count's slot, byte offset, bytes); the counts are read on gathered's device (on a GPU the host
  // reads nothing).
  m.def(
      "sparse_unpack_gathered_rows_into(Tensor gathered, int[] regions, ScalarType value_dtype, Tensor scale, "
      "int divisor, Tensor(a!)[] outs) -> ()");
  // The sampled packs of many tensors (sparsecomm/core/packing.py's pack_sampled and pack_topk,
  // select.h's pack_sampled_many says how): (values, index) of each, the states updated in place.
  m.def(
      "pack_sampled_many(Tensor[] grads, Tensor(a!)?[] residuals, Tensor(b!)?[] momenta, float momentum_factor, "
      "Tensor?[] grad_scales, bool nesterov, bool masking, float[] ratios, int[] plans, int seed, "
      "ScalarType? value_dtype) -> (Tensor[], Tensor[])");
  // pack_sampled_many at fixed capacity (select.h's pack_sampled_fixed): (values, index, counts), tensor
  // p's selection the first counts[p] of its values and index, each of room min(numel, max(k,
  // too_many)); on a GPU the host reads nothing.
  m.def(
      "pack_sampled_fixed(Tensor[] grads, Tensor(a!)?[] residuals, Tensor(b!)?[] momenta, float momentum_factor, "
      "Tensor?[] grad_scales, bool nesterov, bool masking, float[] ratios, int[] plans, int seed, "
      "ScalarType? value_dtype) -> (Tensor[], Tensor[], Tensor)");
  // wire_rows_many_into of sends of fixed capacity: send p's first counts[p] elements, its number of
  // rows written as an int64 at byte places[3p], its rows at places[3p + 1] (of [0, places[3p + 2])).
  m.def("wire_rows_fixed_into(Tensor[] values, Tensor[] index, Tensor counts, int[] places, Tensor(a!) out) -> ()");
  // pack_sampled_fixed's selections sent by send_quantized (quantize.h's pack_quantized_fixed):
  // (codes, scales, index, counts), tensor p's codes and index of the room of its capacity, its first
  // counts[p] sent; on a GPU the host reads nothing.
  m.def(
      "pack_quantized_fixed(Tensor[] grads, Tensor(a!)?[] residuals, Tensor(b!)?[] momenta, float momentum_factor, "
      "Tensor?[] grad_scales, bool nesterov, bool masking, float[] ratios, int[] plans, int seed, int bits) "
      "-> (Tensor[], Tensor[], Tensor[], Tensor)");
  // The fixed-layout 1-/2-bit segments of pack_quantized_fixed's packs into one uint8 chunk: send p's
  // count copied to byte places[3p], its segment (laid out for its room) at places[3p + 1], of a tensor
  // of places[3p + 2] elements.
  m.def(
      "quantized_segments_fixed_into(Tensor[] codes, Tensor[] scales, Tensor[] index, Tensor counts, int bits, "
      "int[] places, Tensor(a!) out) -> ()");
  // sparse_unpack_segments_into of many tensors' fixed segments, each row of `gathered` a rank's chunk,
  // out p's segment at byte regions[2p] laid out for regions[2p + 1] entries; the counts are read on
  // gathered's device (on a GPU the host reads nothing).
  m.def(
      "sparse_unpack_gathered_segments_into(Tensor gathered, int[] regions, int bits, Tensor scale, int divisor, "
      "Tensor(a!)[] outs) -> ()");
}

}  // namespace sparsecomm
