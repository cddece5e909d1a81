"""Typed wrappers of the torch ops in csrc/ (``torch.ops.sparsecomm.*``).

The ops are registered when ``sparsecomm._C`` is imported; the wrappers add nothing but
argument normalisation, so ``torch.ops.sparsecomm.X`` may be called directly too.
"""
from typing import Optional

import torch

from .. import _C  # noqa: F401  (loads the extension, registering torch.ops.sparsecomm)
from . import fakes  # noqa: F401  (registers the ops' fake kernels)
from .._settings import sample_count, seed_as_int64, selected_count

_ops = torch.ops.sparsecomm


def random_block_start(seed: int, tensor_id: int, step: int, numel: int) -> int:
    """Start of the cyclic random block of a tensor of ``numel`` elements at ``step``.

    A pure function of its arguments (Philox4x32-10), identical on every rank and device."""
    return _ops.random_block_start(seed_as_int64(seed), tensor_id, step, numel)


def block_pack(grad: torch.Tensor, residual: Optional[torch.Tensor], start: int, length: int) -> torch.Tensor:
    """Error-feedback pack of the cyclic block ``[start, start + length)`` of ``grad`` (flattened).

    Returns the block's values in ``grad``'s dtype. ``residual`` (float32, ``grad.numel()``
    elements) is updated in place to ``residual + grad`` minus what was sent; ``None`` means
    no error feedback."""
    return _ops.block_pack(grad, residual, start, length)


def block_unpack(values: torch.Tensor, numel: int, start: int, scale: float = 1.0) -> torch.Tensor:
    """Dense 1-D tensor of ``numel`` elements: ``scale * values`` in the block, zero elsewhere."""
    return _ops.block_unpack(values, numel, start, scale)


# --- Selection with error feedback (csrc/kernels/feedback.h, sample.h; csrc/cpu/select.cpp) ---
#
# acc = residual + (momentum_factor * momentum + grad), element-wise; residual and momentum
# (float32, grad's numel) are updated in place; None means that state is absent.

def sample_threshold(grad, residual, ratio, *, momentum=None, momentum_factor=0.0, sample_ratio=0.01,
                     seed=0, tensor_id=0, step=0) -> torch.Tensor:
    """0-d float32 magnitude threshold that about `ratio` of a strided sample of |acc| passes.
    The sample offset comes from the (seed, tensor_id, step) selection stream."""
    return _ops.sample_threshold(grad, residual, momentum, momentum_factor, ratio,
                                 sample_count(grad.numel(), ratio, sample_ratio), seed_as_int64(seed), tensor_id,
                                 step)


def accumulate_candidates(grad, residual, threshold, *, momentum=None, momentum_factor=0.0):
    """One pass: the state takes acc for every element; returns (acc, index int32) of the
    elements with |acc| >= threshold (NaN included), in index order."""
    if not isinstance(threshold, torch.Tensor):
        threshold = torch.tensor(float(threshold))
    return _ops.accumulate_candidates(grad, residual, momentum, momentum_factor, threshold)


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


def sparse_unpack(values, index, numel, scale=1.0, *, out=None):
    """Dense 1-D tensor: scale * (sum of the values at each index, in float32); duplicates add
    (e.g. the concatenated contributions of several ranks). With `out` (contiguous, values'
    dtype), writes there instead of allocating, and returns it."""
    if out is None:
        return _ops.sparse_unpack(values, index, numel, scale)
    if out.numel() != numel:
        raise ValueError(f"sparse_unpack: out should have numel {numel}, got {out.numel()}")
    _ops.sparse_unpack_into(values, index, scale, out)
    return out


def pack_above(grad, residual, threshold, *, momentum=None, momentum_factor=0.0, masking=True):
    """Error-feedback pack of exactly the elements with |acc| >= threshold, in index order:
    one pass over the tensor. Returns (values in grad's dtype, index int32)."""
    acc, index = accumulate_candidates(grad, residual, threshold, momentum=momentum, momentum_factor=momentum_factor)
    return send_selected(acc, index, residual, grad.dtype, momentum=momentum, masking=masking), index


def _accumulated_state(grad, residual, momentum):
    """After accumulate_candidates, the tensor that holds acc for every element."""
    return residual if residual is not None else momentum if momentum is not None else grad


def _top_candidates(grad, residual, k, *, momentum, momentum_factor, sample_ratio, seed, tensor_id, step):
    """Accumulates the state (one pass) and returns the k candidates of largest |acc| (ties:
    lower index), in index order. A sampled threshold set for about 1.5k + 32 candidates keeps
    the exact selection to a small candidate set; if the sample overshoots (fewer than k
    candidates) a second, read-only pass takes every element as a candidate."""
    numel = grad.numel()
    k = min(k, numel)
    if k == 0:
        threshold = float("inf")
    else:
        threshold = sample_threshold(grad, residual, min(1.0, (1.5 * k + 32) / numel), momentum=momentum,
                                     momentum_factor=momentum_factor, sample_ratio=sample_ratio, seed=seed,
                                     tensor_id=tensor_id, step=step)
    acc, index = accumulate_candidates(grad, residual, threshold, momentum=momentum, momentum_factor=momentum_factor)
    if acc.numel() < k:
        acc, index = accumulate_candidates(_accumulated_state(grad, residual, momentum), None, 0.0)
    return select_top(acc, index, k)


def pack_topk(grad, residual, k, *, momentum=None, momentum_factor=0.0, masking=True, sample_ratio=0.01,
              seed=0, tensor_id=0, step=0):
    """Error-feedback pack of exactly the k elements of largest |acc| (ties: lower index),
    in index order: one pass over the tensor (see _top_candidates)."""
    acc, index = _top_candidates(grad, residual, k, momentum=momentum, momentum_factor=momentum_factor,
                                 sample_ratio=sample_ratio, seed=seed, tensor_id=tensor_id, step=step)
    return send_selected(acc, index, residual, grad.dtype, momentum=momentum, masking=masking), index


def random_k_indices(like, k, *, seed, tensor_id, step):
    """k distinct indices of [0, like.numel()), sorted, int32: a pure function of
    (seed, tensor_id, step), identical on every rank and device."""
    return _ops.random_k_indices(like, seed_as_int64(seed), tensor_id, step, k)


def pack_indices(grad, residual, index, *, momentum=None, momentum_factor=0.0, masking=True):
    """Error-feedback pack of the elements at `index` (int32, distinct, ascending): one pass
    to accumulate the state, then an O(k) gather. Returns the values in grad's dtype."""
    if residual is not None or momentum is not None:  # no state: nothing to accumulate
        accumulate_candidates(grad, residual, float("inf"), momentum=momentum, momentum_factor=momentum_factor)
    acc = _accumulated_state(grad, residual, momentum).reshape(-1)[index.long()].float()
    return send_selected(acc, index, residual, grad.dtype, momentum=momentum, masking=masking)


def pack_randomk(grad, residual, k, *, seed, tensor_id, step, momentum=None, momentum_factor=0.0, masking=True):
    """Shared-seed random-k: every rank packs the same k coordinates, so the values can be
    summed by an allreduce with no indices on the wire. Returns (values, index)."""
    index = random_k_indices(grad, min(k, grad.numel()), seed=seed, tensor_id=tensor_id, step=step)
    return pack_indices(grad, residual, index, momentum=momentum, momentum_factor=momentum_factor,
                        masking=masking), index


def pack_rtopk(grad, residual, r, k, *, seed, tensor_id, step, momentum=None, momentum_factor=0.0, masking=True,
               sample_ratio=0.01):
    """rTop-k (Barnes et al. 2020): k elements drawn uniformly (shared-seed stream) from the
    r of largest |acc|, in index order. Returns (values, index)."""
    acc, index = _top_candidates(grad, residual, max(r, k), momentum=momentum, momentum_factor=momentum_factor,
                                 sample_ratio=sample_ratio, seed=seed, tensor_id=tensor_id, step=step)
    pick = random_k_indices(acc, min(k, acc.numel()), seed=seed, tensor_id=tensor_id, step=step).long()
    acc, index = acc[pick], index[pick]
    return send_selected(acc, index, residual, grad.dtype, momentum=momentum, masking=masking), index


def pack_sampled(grad, residual, ratio, *, band=(0.8, 1.3), momentum=None, momentum_factor=0.0, masking=True,
                 sample_ratio=0.01, seed=0, tensor_id=0, step=0, value_dtype=None, bits=None):
    """Error-feedback pack by a sampled threshold (gradient dropping, DGC): about
    k = ratio * numel elements, always between band[0] * k and band[1] * k (bounded
    correction: above the band, the exact top k of the candidates; below it, a second,
    read-only pass takes the exact top k). Returns (values in `value_dtype`, default grad's
    dtype, and index int32); the rounding to value_dtype stays in the residual. With bits (1 or
    2), returns ((codes, scales), index): the values quantized, the error in the residual."""
    numel = grad.numel()
    k = selected_count(ratio, numel)
    if k >= numel:  # everything is sent: no estimate needed (and none could miss an element)
        threshold = 0.0
    else:
        threshold = sample_threshold(grad, residual, ratio, momentum=momentum, momentum_factor=momentum_factor,
                                     sample_ratio=sample_ratio, seed=seed, tensor_id=tensor_id, step=step)
    acc, index = accumulate_candidates(grad, residual, threshold, momentum=momentum, momentum_factor=momentum_factor)
    if acc.numel() > band[1] * k:
        acc, index = select_top(acc, index, k)
    elif acc.numel() < band[0] * k:
        acc, index = select_top(*accumulate_candidates(_accumulated_state(grad, residual, momentum), None, 0.0), k)
    if bits is not None:
        return send_quantized(acc, index, residual, bits, momentum=momentum, masking=masking), index
    return send_selected(acc, index, residual, value_dtype or grad.dtype, momentum=momentum, masking=masking), index
