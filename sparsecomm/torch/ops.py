"""Typed wrappers of the torch ops in csrc/ (``torch.ops.sparsecomm.*``).

The ops are registered when ``sparsecomm._C`` is imported; the wrappers add nothing but
argument normalisation, so ``torch.ops.sparsecomm.X`` may be called directly too.
"""

import torch

from .. import build_info

build_info.require("torch", torch.__version__)  # before loading: a mismatch says which versions
from .. import _C  # noqa: F401,E402  (loads the extension, registering torch.ops.sparsecomm)
from ..core import packing  # noqa: E402
from ..core.selection import sample_count, seed_as_int64  # noqa: E402
from . import fakes  # noqa: F401,E402  (registers the ops' fake kernels)

_ops = torch.ops.sparsecomm


def _checked_out(op, out, numel):
    """An unpack's `out` buffer, which must hold the dense tensor's numel elements (the ops
    take its size as the tensor's)."""
    if out.numel() != numel:
        raise ValueError(f"{op}: out should have numel {numel}, got {out.numel()}")
    return out


def reads_wait(device):
    """Whether reading a tensor's data on the host waits for a device: on CUDA, and under the
    emulated CUDA binding (the tests' stand-in for a GPU, whose tensors are on the CPU)."""
    return device.type == "cuda" or _ops is not torch.ops.sparsecomm


def random_block_start(seed: int, tensor_id: int, step: int, numel: int) -> int:
    """Start of the cyclic random block of a tensor of ``numel`` elements at ``step``.

    A pure function of its arguments (Philox4x32-10), identical on every rank and device."""
    return _ops.random_block_start(seed_as_int64(seed), tensor_id, step, numel)


def block_pack(grad: torch.Tensor, residual: torch.Tensor | None, start: int, length: int) -> torch.Tensor:
    """Error-feedback pack of the cyclic block ``[start, start + length)`` of ``grad`` (flattened).

    Returns the block's values in ``grad``'s dtype. ``residual`` (float32, ``grad.numel()``
    elements) is updated in place to ``residual + grad`` minus what was sent; ``None`` means
    no error feedback."""
    return _ops.block_pack(grad, residual, start, length)


def block_unpack(values: torch.Tensor, numel: int, start: int, scale: float = 1.0, *, out=None) -> torch.Tensor:
    """Dense 1-D tensor of ``numel`` elements: ``scale * values`` in the block, zero elsewhere.
    With `out` (contiguous, values' dtype), writes there in one pass and returns it."""
    if out is None:
        return _ops.block_unpack(values, numel, start, scale)
    _ops.block_unpack_into(values, start, scale, _checked_out("block_unpack", out, numel))
    return out


# --- Selection with error feedback (csrc/kernels/feedback.h, sample.h; csrc/cpu/select.cpp) ---
#
# acc = residual + (momentum_factor * momentum + grad), element-wise; residual and momentum
# (float32, grad's numel) are updated in place; None means that state is absent. nesterov=True
# (with a momentum): momentum <- momentum_factor * (momentum + grad), acc = (residual + momentum) + grad.


def sample_threshold(
    grad,
    residual,
    ratio,
    *,
    momentum=None,
    momentum_factor=0.0,
    sample_ratio=0.01,
    seed=0,
    tensor_id=0,
    step=0,
    grad_scale=None,
    nesterov=False,
) -> torch.Tensor:
    """0-d float32 magnitude threshold that about `ratio` of a strided sample of |acc| passes.
    The sample offset comes from the (seed, tensor_id, step) selection stream. grad_scale (a
    1-element float32 tensor on grad's device, or None): grad is read times it, rounded once to
    its dtype, as if scaled in place first (DGC's clipping factor, never read by the host)."""
    return _ops.sample_threshold(
        grad,
        residual,
        momentum,
        momentum_factor,
        ratio,
        sample_count(grad.numel(), ratio, sample_ratio),
        seed_as_int64(seed),
        tensor_id,
        step,
        grad_scale,
        nesterov,
    )


def accumulate_candidates(
    grad, residual, threshold, *, momentum=None, momentum_factor=0.0, grad_scale=None, nesterov=False
):
    """One pass: the state takes acc for every element; returns (acc, index int32) of the
    elements with |acc| >= threshold (NaN included), in index order. grad_scale: as
    sample_threshold's (it needs a residual or a momentum)."""
    if not isinstance(threshold, torch.Tensor):
        threshold = torch.tensor(float(threshold), device=grad.device)
    return _ops.accumulate_candidates(grad, residual, momentum, momentum_factor, threshold, grad_scale, nesterov)


def accumulate(grad, residual, *, momentum=None, momentum_factor=0.0):
    """accumulate_candidates with nothing selected: one pass, the state takes acc for every
    element. No output depends on the data, so a GPU need not be waited for."""
    _ops.accumulate(grad, residual, momentum, momentum_factor)


def select_top(acc, index, k):
    """The k candidates of largest |acc| (ties: lower index first), in index order."""
    return _ops.select_top(acc, index, k)


def send_selected(acc, index, residual, dtype, *, momentum=None, masking=True):
    """Values to send, in `dtype`; the state of each sent element keeps only its rounding
    error (and its momentum is zeroed when masking)."""
    return _ops.send_selected(acc, index, residual, momentum, masking, dtype)


def send_quantized(acc, index, residual, bits, *, momentum=None, masking=True):
    """Like send_selected, with the values quantized to `bits` (1 or 2) and per-tensor scales
    (csrc/kernels/quantize.h). Returns (codes uint8, packed; scales float32); the state of
    each sent element keeps acc - decoded value."""
    return _ops.send_quantized(acc, index, residual, momentum, masking, bits)


def dequantize(codes, scales, count, bits):
    """The float32 values of `count` quantized codes."""
    return _ops.dequantize(codes, scales, count, bits)


def quantized_segment(codes, scales, index, bits, numel):
    """This rank's 1-/2-bit segment of sparsecomm.core.wire (uint8) of a tensor of `numel`
    elements: count, scales, bucket counts, offsets (index int32, strictly ascending), codes."""
    return _ops.quantized_segment(codes, scales, index, bits, numel)


def _unpack_scale(scale, out):
    """The unpack ops' scale tensor: `scale` itself, or a number made one on out's device."""
    return scale if isinstance(scale, torch.Tensor) else torch.full((1,), scale, dtype=torch.float32, device=out.device)


def sparse_unpack_segments(gathered, bits, ranks, numel, scale=1.0, divisor=1, *, out):
    """sparse_unpack of `ranks` quantized segments gathered in rank order (each decoded with its
    rank's scales, the values cast to out's dtype), into `out` (contiguous), the sums multiplied by
    scale / divisor. `scale` may be a 1-element float32 tensor on out's device, read where the op
    runs: on a GPU the host never waits for it. Returns out."""
    out = _checked_out("sparse_unpack_segments", out, numel)
    _ops.sparse_unpack_segments_into(gathered, bits, ranks, _unpack_scale(scale, out), divisor, out)
    return out


def sparse_unpack(values, index, numel, scale=1.0, *, out=None):
    """Dense 1-D tensor: scale * (sum of the values at each index, in float32); duplicates add
    (e.g. the concatenated contributions of several ranks). With `out` (contiguous, values'
    dtype), writes there instead of allocating, and returns it."""
    if out is None:
        return _ops.sparse_unpack(values, index, numel, scale)
    _ops.sparse_unpack_into(values, index, scale, _checked_out("sparse_unpack", out, numel))
    return out


def momentum_step(grad, momentum, momentum_factor, *, grad_scale=None, nesterov=False):
    """DGC's dense route, one pass, in place: momentum <- momentum_factor * momentum + grad, and
    grad <- that, rounded to grad's dtype (contiguous); with nesterov, momentum <-
    momentum_factor * (momentum + grad) and grad <- momentum + grad. grad_scale: as
    sample_threshold's."""
    _ops.momentum_step(grad, momentum, momentum_factor, grad_scale, nesterov)


def clip_factors_into(grads, limits, factors):
    """DGC's clipping factors of many gradients in one op (on a GPU, two kernels): factors[p] (a
    1-element float32 tensor on the gradients' device) = limits[p] / norm where grads[p]'s norm
    (sum_of_squares, square-rooted in float64) is above limits[p], else 1: the bits of
    ``torch.where(norm > limit, limit / norm, 1.0).float()``. Nothing is read on the host."""
    _ops.clip_factors_into(grads, limits, factors)


def momentum_step_many(grads, momenta, momentum_factor, *, grad_scales=None, nesterov=False):
    """momentum_step of many gradients (contiguous, each its own dtype) in one op: on a GPU, one
    kernel. grad_scales: None, or one grad_scale (or None) per gradient."""
    scales = [None] * len(grads) if grad_scales is None else grad_scales
    _ops.momentum_step_many(grads, momenta, momentum_factor, scales, nesterov)


def sum_of_squares(x):
    """The sum of the squares of ``x`` (float32, float16 or bfloat16, any shape) as a 0-d
    float64 tensor on x's device: one read of x, no float32 copy, the same bits on CPU and CUDA
    and on every run (a fixed order of addition, csrc/kernels/squares.h)."""
    return _ops.sum_of_squares(x)


def wire_rows(values, index, start, length):
    """The wire rows of sparsecomm.core.wire of a send of [start, start + length) (index int32,
    strictly ascending inside it): uint8 [k + wire.buckets(start, length), 2 + value bytes]."""
    return _ops.wire_rows(values, index, start, length)


def wire_rows_into(values, index, start, length, *, out):
    """wire_rows written into `out` (uint8, contiguous, exactly the rows' bytes, any shape): where
    they travel, with no tensor of their own. Returns out."""
    _ops.wire_rows_into(values, index, start, length, out)
    return out


def wire_rows_many_into(values, indices, places, *, out):
    """wire_rows_into of many whole sends (values[p], indices[p]) into one uint8 chunk `out` (1-D,
    contiguous): send p's rows of [0, places[p][1]) at byte places[p][0]. Returns out."""
    _ops.wire_rows_many_into(values, indices, [number for place in places for number in place], out)
    return out


def wire_rows_fixed_into(values, indices, counts, places, *, out):
    """wire_rows_many_into of sends of fixed capacity (pack_sampled_fixed's): send p's first
    counts[p] elements (counts: int64 on out's device, not read by the host), its number of rows
    written as an int64 at byte places[p][0] of out, its rows at places[p][1] (of [0,
    places[p][2])). Returns out."""
    _ops.wire_rows_fixed_into(values, indices, counts, [number for place in places for number in place], out)
    return out


def wire_columns(rows, value_dtype):
    """(values, index int32) of wire rows whose values are `value_dtype` (any sends, one after
    the other), in order: the marker rows dropped."""
    return _ops.wire_columns(rows, value_dtype)


def sparse_unpack_rows(rows, value_dtype, numel, scale=1.0, divisor=1, *, out):
    """sparse_unpack of gathered wire rows whose values are `value_dtype` (each rank's rows, in
    rank order), into `out` (contiguous; the values are cast to its dtype), the sums multiplied by
    scale / divisor (scale: a number, or a tensor as sparse_unpack_segments takes). Returns out."""
    out = _checked_out("sparse_unpack_rows", out, numel)
    _ops.sparse_unpack_rows_into(rows, value_dtype, _unpack_scale(scale, out), divisor, out)
    return out


def sparse_unpack_gathered_rows(gathered, regions, value_dtype, scale=1.0, divisor=1, *, outs):
    """sparse_unpack_rows of many tensors' rows gathered from every rank in one collective (a DDP
    bucket's), into `outs` (contiguous, one dtype; on CUDA, views of one allocation). Each row of
    `gathered` (uint8, 2-D) is a rank's chunk: a header of row counts (int64), then the tensors'
    regions, regions[p] = (out p's count slot in the header, byte offset, bytes). The counts are
    read where the op runs: on a GPU the host reads nothing."""
    if outs:
        flat = [number for region in regions for number in region]
        _ops.sparse_unpack_gathered_rows_into(gathered, flat, value_dtype, _unpack_scale(scale, outs[0]), divisor, outs)


def pack_sampled_many(
    grads, residuals, momenta, momentum_factor, grad_scales, nesterov, masking, ratios, plans, seed, value_dtype
):
    """The sampled packs of many tensors in one op (sparsecomm.torch.sampled_packs builds the
    arguments from each tensor's core.packing.Plan): ([values], [index]), the states updated."""
    return _ops.pack_sampled_many(
        grads, residuals, momenta, momentum_factor, grad_scales, nesterov, masking, ratios, plans, seed, value_dtype
    )


def pack_sampled_fixed(
    grads, residuals, momenta, momentum_factor, grad_scales, nesterov, masking, ratios, plans, seed, value_dtype
):
    """pack_sampled_many at fixed capacity: ([values], [index], counts), tensor p's selection the
    first counts[p] (int64, on the gradients' device) of its values and index, each of room
    min(numel, max(k, too_many)). On a GPU the host reads nothing."""
    return _ops.pack_sampled_fixed(
        grads, residuals, momenta, momentum_factor, grad_scales, nesterov, masking, ratios, plans, seed, value_dtype
    )


def pack_quantized_fixed(
    grads, residuals, momenta, momentum_factor, grad_scales, nesterov, masking, ratios, plans, seed, bits
):
    """pack_sampled_fixed's selections sent by send_quantized (`bits`: 1 or 2), the bits of
    pack_sampled(bits=...) tensor by tensor: ([codes], [scales], [index], counts), tensor p's codes
    and index of the room of its capacity, its first counts[p] (int64, on the gradients' device) sent.
    On a GPU the host reads nothing."""
    return _ops.pack_quantized_fixed(
        grads, residuals, momenta, momentum_factor, grad_scales, nesterov, masking, ratios, plans, seed, bits
    )


def quantized_segments_fixed_into(codes, scales, indices, counts, bits, places, *, out):
    """The fixed-layout 1-/2-bit segments of pack_quantized_fixed's packs written into one uint8 chunk
    `out` (1-D, contiguous): send p's first counts[p] elements (counts: int64 on out's device, not
    read by the host), its segment laid out for its room (indices[p]'s length) whatever its count, at
    byte places[p][1], a copy of its count at places[p][0], of a tensor of places[p][2] elements.
    Returns out."""
    flat = [number for place in places for number in place]
    _ops.quantized_segments_fixed_into(codes, scales, indices, counts, bits, flat, out)
    return out


def sparse_unpack_gathered_segments(gathered, regions, bits, scale=1.0, divisor=1, *, outs):
    """sparse_unpack_segments of many tensors' fixed segments gathered from every rank in one
    collective (a DDP bucket's), into `outs` (contiguous, one dtype; on CUDA, views of one
    allocation). Each row of `gathered` (uint8, 2-D) is a rank's chunk, regions[p] = (out p's
    segment's byte offset, its room). The counts are read where the op runs: on a GPU the host
    reads nothing."""
    if outs:
        flat = [number for region in regions for number in region]
        _ops.sparse_unpack_gathered_segments_into(gathered, flat, bits, _unpack_scale(scale, outs[0]), divisor, outs)


def random_k_indices(like, k, *, seed, tensor_id, step):
    """k distinct indices of [0, like.numel()), sorted, int32: a pure function of
    (seed, tensor_id, step), identical on every rank and device."""
    return _ops.random_k_indices(like, seed_as_int64(seed), tensor_id, step, k)


class _Kernels:
    """These ops in the functional form of sparsecomm.core.packing: the state is updated in
    place and returned as it is."""

    sample_threshold = staticmethod(sample_threshold)

    @staticmethod
    def select_band(acc, index, every, k, too_few, too_many):  # TF's select_band, composed
        if acc.numel() < too_few:
            acc, index = accumulate_candidates(every, None, 0.0)
        elif acc.numel() <= too_many:
            return acc, index
        return select_top(acc, index, k)

    @staticmethod
    def random_k_indices(like, k, *, seed, tensor_id, step):  # at most every element
        return random_k_indices(like, min(k, like.numel()), seed=seed, tensor_id=tensor_id, step=step)

    @staticmethod
    def accumulate_candidates(grad, residual, threshold, **state):  # (the state is updated in place)
        acc, index = accumulate_candidates(grad, residual, threshold, **state)
        return acc, index, residual, state.get("momentum")

    @staticmethod
    def accumulate(grad, residual, *, momentum=None, momentum_factor=0.0):
        accumulate(grad, residual, momentum=momentum, momentum_factor=momentum_factor)
        return residual, momentum

    @staticmethod
    def send_selected(acc, index, residual, dtype, *, momentum=None, masking=True):
        return send_selected(acc, index, residual, dtype, momentum=momentum, masking=masking), residual, momentum

    @staticmethod
    def send_quantized(acc, index, residual, bits, *, momentum=None, masking=True):
        return (*send_quantized(acc, index, residual, bits, momentum=momentum, masking=masking), residual, momentum)

    numel = staticmethod(torch.Tensor.numel)
    dtype = staticmethod(lambda t: t.dtype)
    gather = staticmethod(lambda x, index: x[index.long()])
    gather_float = staticmethod(lambda x, index: x.reshape(-1)[index.long()].float())


KERNELS = _Kernels()


# The error-feedback packs of sparsecomm.core.packing on these kernels, returning (values, index).
pack_above, pack_topk, pack_rtopk, pack_indices, pack_randomk, pack_sampled = packing.bound(KERNELS, results=2)
