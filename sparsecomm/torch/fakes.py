"""Fake kernels of the torch ops in csrc/ (``torch.ops.sparsecomm.*``), all in one place.

A fake kernel gives an op's outputs (shape, dtype, device) without computing them, so the ops
trace under torch.compile and pass ``torch.library.opcheck``; each also serves as the op's
Meta kernel. Outputs whose size depends on the data (the candidates) get a dynamic size.
``random_block_start`` takes and returns no tensors and needs none.
"""

import torch

from .. import _C  # noqa: F401  (loads the extension: the ops must exist before their fakes)
from ..core import wire

FAKES = {}  # op name -> fake kernel (the emulated CUDA test build registers them for its namespace too)


def _fake(name):
    def register(fake):
        FAKES[name] = fake
        return torch.library.register_fake(f"sparsecomm::{name}")(fake)

    return register


# --- block family (csrc/torch/block.h) ---


@_fake("block_pack")
def _block_pack(grad, residual, start, length):
    return grad.new_empty(length)


@_fake("block_unpack")
def _block_unpack(values, numel, start, scale):
    return values.new_empty(numel)


@_fake("block_unpack_into")
def _block_unpack_into(values, start, scale, out):
    return None


# --- select family (csrc/torch/select.h) ---


@_fake("sample_threshold")
def _sample_threshold(
    grad,
    residual,
    momentum,
    momentum_factor,
    ratio,
    sample_count,
    seed,
    tensor_id,
    step,
    grad_scale=None,
    nesterov=False,
):
    return grad.new_empty((), dtype=torch.float32)


@_fake("accumulate_candidates")
def _accumulate_candidates(grad, residual, momentum, momentum_factor, threshold, grad_scale=None, nesterov=False):
    count = torch.library.get_ctx().new_dynamic_size()
    return grad.new_empty(count, dtype=torch.float32), grad.new_empty(count, dtype=torch.int32)


@_fake("select_top")
def _select_top(acc, index, k):
    count = torch.library.get_ctx().new_dynamic_size()
    return acc.new_empty(count), index.new_empty(count)


@_fake("send_selected")
def _send_selected(acc, index, residual, momentum, masking, dtype):
    return acc.new_empty(acc.shape, dtype=dtype)


@_fake("pack_sampled_many")
def _pack_sampled_many(
    grads, residuals, momenta, momentum_factor, grad_scales, nesterov, masking, ratios, plans, seed, value_dtype
):
    ctx = torch.library.get_ctx()
    counts = [ctx.new_dynamic_size() for _ in grads]
    values = [g.new_empty(n, dtype=value_dtype or g.dtype) for g, n in zip(grads, counts)]
    return values, [g.new_empty(n, dtype=torch.int32) for g, n in zip(grads, counts)]


@_fake("sparse_unpack")
def _sparse_unpack(values, index, numel, scale):
    return values.new_empty(numel)


@_fake("sparse_unpack_into")
def _sparse_unpack_into(values, index, scale, out):
    return None


@_fake("accumulate")
def _accumulate(grad, residual, momentum, momentum_factor):
    return None


@_fake("momentum_step")
def _momentum_step(grad, momentum, momentum_factor, grad_scale=None, nesterov=False):
    return None


@_fake("clip_factors_into")
def _clip_factors_into(grads, limits, factors):
    return None


@_fake("momentum_step_many")
def _momentum_step_many(grads, momenta, momentum_factor, grad_scales, nesterov=False):
    return None


@_fake("sum_of_squares")
def _sum_of_squares(x):
    return x.new_empty((), dtype=torch.float64)


@_fake("quantized_segment")
def _quantized_segment(codes, scales, index, bits, numel):
    layout = wire.Segment(index.numel(), scales.numel(), bits, numel)
    return codes.new_empty(layout.size)


@_fake("sparse_unpack_segments_into")
def _sparse_unpack_segments_into(gathered, bits, ranks, scale, divisor, out):
    return None


@_fake("wire_rows")
def _wire_rows(values, index, start, length):
    rows = index.numel() + wire.buckets(start, length)
    return values.new_empty((rows, wire.row_bytes(values.element_size())), dtype=torch.uint8)


@_fake("wire_rows_into")
def _wire_rows_into(values, index, start, length, out):
    return None


@_fake("pack_sampled_fixed")
def _pack_sampled_fixed(
    grads, residuals, momenta, momentum_factor, grad_scales, nesterov, masking, ratios, plans, seed, value_dtype
):
    rooms = [min(g.numel(), max(plans[6 * p], plans[6 * p + 3])) for p, g in enumerate(grads)]
    values = [g.new_empty(room, dtype=value_dtype or g.dtype) for g, room in zip(grads, rooms)]
    indices = [g.new_empty(room, dtype=torch.int32) for g, room in zip(grads, rooms)]
    device = grads[0].device if grads else "cpu"
    return values, indices, torch.empty(len(grads), dtype=torch.int64, device=device)


@_fake("wire_rows_fixed_into")
def _wire_rows_fixed_into(values, index, counts, places, out):
    return None


@_fake("pack_quantized_fixed")
def _pack_quantized_fixed(
    grads, residuals, momenta, momentum_factor, grad_scales, nesterov, masking, ratios, plans, seed, bits
):
    rooms = [min(g.numel(), max(plans[6 * p], plans[6 * p + 3])) for p, g in enumerate(grads)]
    codes = [g.new_empty(wire.code_bytes(room, bits), dtype=torch.uint8) for g, room in zip(grads, rooms)]
    scales = [g.new_empty(wire.scale_count(bits), dtype=torch.float32) for g in grads]
    indices = [g.new_empty(room, dtype=torch.int32) for g, room in zip(grads, rooms)]
    device = grads[0].device if grads else "cpu"
    return codes, scales, indices, torch.empty(len(grads), dtype=torch.int64, device=device)


@_fake("quantized_segments_fixed_into")
def _quantized_segments_fixed_into(codes, scales, index, counts, bits, places, out):
    return None


@_fake("sparse_unpack_gathered_segments_into")
def _sparse_unpack_gathered_segments_into(gathered, regions, bits, scale, divisor, outs):
    return None


@_fake("wire_rows_many_into")
def _wire_rows_many_into(values, index, places, out):
    return None


@_fake("wire_columns")
def _wire_columns(rows, value_dtype):
    count = torch.library.get_ctx().new_dynamic_size()  # the marker rows dropped
    return rows.new_empty(count, dtype=value_dtype), rows.new_empty(count, dtype=torch.int32)


@_fake("sparse_unpack_rows_into")
def _sparse_unpack_rows_into(rows, value_dtype, scale, divisor, out):
    return None


@_fake("sparse_unpack_gathered_rows_into")
def _sparse_unpack_gathered_rows_into(gathered, regions, value_dtype, scale, divisor, outs):
    return None


@_fake("random_k_indices")
def _random_k_indices(like, seed, tensor_id, step, k):
    return like.new_empty(k, dtype=torch.int32)


# --- quantize family (csrc/torch/quantize.h; sizes from csrc/kernels/quantize.h) ---


@_fake("send_quantized")
def _send_quantized(acc, index, residual, momentum, masking, bits):
    codes = acc.new_empty((acc.numel() * bits + 7) // 8, dtype=torch.uint8)
    return codes, acc.new_empty(2 if bits == 1 else 4)


@_fake("dequantize")
def _dequantize(codes, scales, count, bits):
    return codes.new_empty(count, dtype=torch.float32)
