"""The error-feedback packs of every method, written once over a framework's kernels.

`K` is a framework's kernel set (sparsecomm/torch/ops.py and sparsecomm/tensorflow/ops.py
each build one, `KERNELS`): the compiled ops in a functional form, where every op that
updates the state returns it (torch updates in place and returns the same tensors), plus
`numel`, `dtype`, `gather` and `gather_float`.

acc = residual + (momentum_factor * momentum + grad), element-wise. Every pack returns
(values, index, residual, momentum): the values to send (or (codes, scales) when quantized),
their int32 indices in index order, and the state after the pack (None where absent).
"""

import math
from dataclasses import dataclass

from .selection import BAND, candidate_ratio, sample_count, selected_count


def _accumulated(grad, residual, momentum):
    """After an accumulation, the tensor that holds acc for every element."""
    return residual if residual is not None else momentum if momentum is not None else grad


def _send(K, acc, index, residual, momentum, masking, dtype=None, bits=None):
    if bits is not None:
        codes, scales, residual, momentum = K.send_quantized(
            acc, index, residual, bits, momentum=momentum, masking=masking
        )
        return (codes, scales), index, residual, momentum
    values, residual, momentum = K.send_selected(acc, index, residual, dtype, momentum=momentum, masking=masking)
    return values, index, residual, momentum


def pack_above(K, grad, residual, threshold, *, momentum=None, momentum_factor=0.0, masking=True):
    """Exactly the elements with |acc| >= threshold, in index order: one pass."""
    acc, index, residual, momentum = K.accumulate_candidates(
        grad, residual, threshold, momentum=momentum, momentum_factor=momentum_factor
    )
    return _send(K, acc, index, residual, momentum, masking, K.dtype(grad))


@dataclass(frozen=True)
class Plan:
    """How a sampled selection treats one tensor of `numel` elements: the threshold sampled at
    `ratio` from `sample_count` positions (0: none is sampled; every element is a candidate, or
    none for k = 0), then k exactly where the candidates number more than `too_many` (their top
    k) or fewer than `too_few` (every element's top k), else the candidates as they are. The
    composites below and the batched op (sparsecomm.torch.sampled_packs) follow it."""

    ratio: float
    sample_count: int
    k: int
    too_few: int
    too_many: int

    @classmethod
    def sampled(cls, numel, ratio, sample_ratio):
        """pack_sampled's: about ratio * numel, the count kept within the band."""
        k = selected_count(ratio, numel)
        count = 0 if k >= numel else sample_count(numel, ratio, sample_ratio)
        return cls(ratio, count, k, math.ceil(BAND[0] * k), math.floor(BAND[1] * k))

    @classmethod
    def top(cls, numel, k, sample_ratio):
        """top_candidates': exactly k, from a threshold that aims above k (candidate_ratio)."""
        k = min(k, numel)
        ratio = candidate_ratio(k, numel, sample_ratio)
        return cls(ratio, sample_count(numel, ratio, sample_ratio) if k else 0, k, k, k - 1)


def top_candidates(
    K, grad, residual, k, *, momentum=None, momentum_factor=0.0, sample_ratio=0.01, seed=0, tensor_id=0, step=0
):
    """Accumulates the state (one pass) and returns the k candidates of largest |acc| (ties:
    lower index), in index order, with the state. A sampled threshold set for a few standard
    deviations more than k candidates keeps the exact selection to a small set; if the sample
    overshoots (fewer than k candidates), a second, read-only pass takes every element as a
    candidate (selection.candidate_ratio)."""
    plan = Plan.top(K.numel(grad), k, sample_ratio)
    state = dict(momentum=momentum, momentum_factor=momentum_factor)
    if plan.sample_count == 0:
        threshold = float("inf")
    else:
        stream = dict(sample_ratio=sample_ratio, seed=seed, tensor_id=tensor_id, step=step)
        threshold = K.sample_threshold(grad, residual, plan.ratio, **stream, **state)
    acc, index, residual, momentum = K.accumulate_candidates(grad, residual, threshold, **state)
    return (*_within_band(K, plan, acc, index, _accumulated(grad, residual, momentum)), residual, momentum)


def pack_topk(K, grad, residual, k, *, masking=True, **selection):
    """Exactly the k elements of largest |acc| (ties: lower index), in index order. `selection`:
    top_candidates' keywords (momentum, momentum_factor; sample_ratio, seed, tensor_id, step)."""
    acc, index, residual, momentum = top_candidates(K, grad, residual, k, **selection)
    return _send(K, acc, index, residual, momentum, masking, K.dtype(grad))


def pack_rtopk(K, grad, residual, r, k, *, seed, tensor_id, step, masking=True, **selection):
    """rTop-k (Barnes et al. 2020): k elements drawn uniformly (shared-seed stream) from the r
    of largest |acc|, in index order. `selection`: top_candidates' other keywords (momentum,
    momentum_factor, sample_ratio)."""
    stream = dict(seed=seed, tensor_id=tensor_id, step=step)
    acc, index, residual, momentum = top_candidates(K, grad, residual, max(r, k), **stream, **selection)
    pick = K.random_k_indices(acc, k, **stream)
    acc, index = K.gather(acc, pick), K.gather(index, pick)
    return _send(K, acc, index, residual, momentum, masking, K.dtype(grad))


def pack_indices(K, grad, residual, index, *, momentum=None, momentum_factor=0.0, masking=True):
    """The elements at `index` (int32, distinct, ascending): one pass to accumulate the state
    (none without state), then an O(k) gather."""
    if residual is not None or momentum is not None:
        residual, momentum = K.accumulate(grad, residual, momentum=momentum, momentum_factor=momentum_factor)
    acc = K.gather_float(_accumulated(grad, residual, momentum), index)
    return _send(K, acc, index, residual, momentum, masking, K.dtype(grad))


def pack_randomk(K, grad, residual, k, *, seed, tensor_id, step, momentum=None, momentum_factor=0.0, masking=True):
    """Shared-seed random-k: every rank packs the same k coordinates, so the values can be
    summed by an allreduce with no indices on the wire."""
    index = K.random_k_indices(grad, k, seed=seed, tensor_id=tensor_id, step=step)
    return pack_indices(K, grad, residual, index, momentum=momentum, momentum_factor=momentum_factor, masking=masking)


def pack_sampled(
    K,
    grad,
    residual,
    ratio,
    *,
    momentum=None,
    momentum_factor=0.0,
    masking=True,
    sample_ratio=0.01,
    seed=0,
    tensor_id=0,
    step=0,
    value_dtype=None,
    bits=None,
    grad_scale=None,
    nesterov=False,
):
    """Sampled threshold with bounded correction (gradient dropping, DGC): about
    k = ratio * numel elements, always between BAND[0] k and BAND[1] k (above the band, the
    exact top k of the candidates; below it, a second, read-only pass takes the exact top k).
    Values in `value_dtype` (default grad's; the rounding stays in the residual), or with bits
    (1 or 2) as (codes, scales), the quantization error in the residual. grad_scale: a factor
    (0-d float32 tensor) the gradient is read times, DGC's clipping (a state is needed: the
    second pass reads acc from it). nesterov: DGC's Nesterov momentum (feedback.h; it needs the
    residual and the momentum)."""
    plan = Plan.sampled(K.numel(grad), ratio, sample_ratio)
    state = dict(momentum=momentum, momentum_factor=momentum_factor, grad_scale=grad_scale, nesterov=nesterov)
    if plan.sample_count == 0:  # everything is sent: no estimate needed (and none could miss an element)
        threshold = 0.0
    else:
        stream = dict(sample_ratio=sample_ratio, seed=seed, tensor_id=tensor_id, step=step)
        threshold = K.sample_threshold(grad, residual, ratio, **stream, **state)
    acc, index, residual, momentum = K.accumulate_candidates(grad, residual, threshold, **state)
    if plan.sample_count:  # (with none, every element is a candidate: the band holds)
        acc, index = _within_band(K, plan, acc, index, _accumulated(grad, residual, momentum))
    return _send(K, acc, index, residual, momentum, masking, value_dtype or K.dtype(grad), bits)


def _within_band(K, plan, acc, index, every):
    """The candidates (acc, index) brought into the plan's band: below it, the exact top k of
    every element of `every` (the tensor that holds each element's acc: a second, read-only
    pass); above it, the exact top k of the candidates; within it, the candidates. One op in a
    TF graph, where a branch would cost a tf.cond (K.select_band)."""
    return K.select_band(acc, index, every, plan.k, plan.too_few, plan.too_many)


COMPOSITES = (pack_above, pack_topk, pack_rtopk, pack_indices, pack_randomk, pack_sampled)


def bound(K, results=4):
    """COMPOSITES on the kernels K, in that order, each returning its first `results` results
    (torch: 2, the values and the index; its state is updated in place)."""

    def bind(composite):
        def pack(*args, **kwargs):
            return composite(K, *args, **kwargs)[:results]

        pack.__name__, pack.__doc__ = composite.__name__, composite.__doc__
        return pack

    return tuple(bind(composite) for composite in COMPOSITES)
