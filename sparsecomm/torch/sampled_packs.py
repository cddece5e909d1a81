"""The sampled packs of a compressor (Threshold and DGC's pack_sampled, TopK's pack_topk), run by
one op for many tensors (``sparsecomm::pack_sampled_many``): a DDP bucket's packs cross from
Python into C++ once, not four ops per tensor. The op composes each tensor's pack exactly as
sparsecomm.core.packing does, through the same op bodies: the same bits as ops.pack_sampled and
ops.pack_topk, tensor by tensor. DGC's dense payloads (ops.momentum_step) and clipping factors
queue the same way, into one ``momentum_step_many`` and one ``clip_factors_into``; rTop-k's top r
(where a read waits) into one ``pack_sampled_fixed``; a DDP bucket's 1-/2-bit packs into one
``pack_quantized_fixed``."""

import contextlib
import functools
from dataclasses import dataclass

import torch

from ..core import wire
from ..core.exchange import Packed
from ..core.packing import Plan
from . import ops

# A tensor's plan is a function of its numel and ratios: computed once per shape and density, not per step.
_sampled_plan = functools.lru_cache(maxsize=4096)(Plan.sampled)
_top_plan = functools.lru_cache(maxsize=4096)(Plan.top)


@dataclass(frozen=True)
class Shared:
    """What the op takes once for all its tensors: a compressor's method settings."""

    momentum_factor: float = 0.0
    nesterov: bool = False
    masking: bool = True
    value_dtype: torch.dtype | None = None  # None: each gradient's own
    bits: int | None = None  # 1 or 2: quantized sends (pack_quantized_fixed)


_shared = functools.lru_cache(maxsize=64)(Shared)  # (a compressor's few settings: made once, not per tensor)


def _made(field):
    """A Packed field that runs the queued packs when it is read before they have run (and cuts a
    fixed-capacity one to its count)."""
    slot = "_" + field

    def read(self):
        if getattr(self, slot) is None:
            self._packs.run()
        if getattr(self, slot) is None and self._cut is not None:
            self._cut()
        return getattr(self, slot)

    return property(read, lambda self, value: setattr(self, slot, value))


class QueuedPack(Packed):
    """A Packed whose values (or codes and scales) and index its SampledPacks fills: reading one
    first runs the packs still queued, so no reader (an exchange, the loss scaler's overflow mark,
    the network calibration's own pack) can see a pack not made yet. At fixed capacity
    (Packed.fixed), values, codes and index are cut to the counts when first read (one host read a
    bucket); a quantized pack's scales need no cut."""

    values = _made("values")
    index = _made("index")
    codes = _made("codes")
    scales = _made("scales")

    def __init__(self, packs, bits=None):
        # Packed's other fields keep their class defaults (None): this runs per tensor and step
        self._packs, self._cut, self._values, self._index, self.bits = packs, None, None, None, bits
        self._codes = self._scales = None


class _Cut:
    """Cuts the fixed-capacity packs of one op to their counts, read on the host once for all."""

    def __init__(self, packs, counts):
        self.packs, self.counts = packs, counts

    def __call__(self):
        for q, count in zip(self.packs, self.counts.tolist()):
            packed = q.packed
            if packed.bits is None:
                values, index, _ = packed.fixed
                packed.values, packed.index = values[:count], index[:count]
            else:
                codes, _, index, _ = packed.fixed
                packed.codes, packed.index = codes[: wire.code_bytes(count, packed.bits)], index[:count]
            packed._cut = None


@dataclass
class Queued:
    """One tensor's pack, waiting: its op arguments and the Packed it fills."""

    packed: Packed
    grad: torch.Tensor
    residual: torch.Tensor | None
    momentum: torch.Tensor | None
    grad_scale: torch.Tensor | None
    plan: Plan
    stream: tuple  # (tensor_id, step)


@dataclass
class Draw:
    """rTop-k's draw of k among a top pack's first `top` entries (their number known), and its send."""

    packed: Packed
    top_pack: Packed
    top: int
    k: int
    residual: torch.Tensor | None
    dtype: torch.dtype
    stream: tuple  # (seed, tensor_id, step)

    def run(self):
        values, index, _ = self.top_pack.fixed
        acc, index = values[: self.top], index[: self.top]
        seed, tensor_id, step = self.stream
        pick = ops.random_k_indices(acc, self.k, seed=seed, tensor_id=tensor_id, step=step)
        self.packed.index = index[pick]
        self.packed.values = ops.send_selected(acc[pick].float(), self.packed.index, self.residual, self.dtype)


class SampledPacks:
    """A compressor's sampled packs and dense momentum steps. Each returns its Packed at once,
    filled by the op at once; inside ``deferred()`` they queue, and one op per Shared (per
    momentum setting) fills them when the block ends, or earlier when one of them is read."""

    def __init__(self):
        self._queue = {}  # Shared -> [Queued]
        self._steps = {}  # (momentum_factor, nesterov) -> [(Packed, grad, momentum, grad_scale)]
        self._clips = []  # [(grad, limit, factor)]: run first, the packs and steps read the factors
        self._tops = []  # [Queued]: rTop-k's top r of acc, at fixed capacity
        self._draws = []  # [Draw]: rTop-k's draws among them, and the sends
        self._deferring = False
        self._fixed = False  # the deferred packs at fixed capacity (QueuedPack.fixed)

    def sampled(
        self, grad, residual, ratio, *, sample_ratio, tensor_id, step, momentum=None, grad_scale=None, **settings
    ):
        """ops.pack_sampled's pack, as a Packed of values and index (with bits, of codes, scales and
        index). `settings`: Shared's (momentum_factor, nesterov, masking, value_dtype, bits). With
        bits it queues at fixed capacity only (a DDP bucket's); else it is made at once, by the
        composite: Horovod's variable-size segments need no fixed capacity."""
        bits = settings.get("bits")
        if bits is not None and not (self._deferring and self._fixed):
            self.run()  # (DGC's clipping factor may wait in the queue)
            stream = dict(sample_ratio=sample_ratio, tensor_id=tensor_id, step=step)
            (codes, scales), index = ops.pack_sampled(
                grad, residual, ratio, momentum=momentum, grad_scale=grad_scale, **stream, **settings
            )
            return Packed(index=index, codes=codes, scales=scales, bits=bits)
        plan = _sampled_plan(grad.numel(), ratio, sample_ratio)
        return self._add(_shared(**settings), grad, residual, momentum, grad_scale, plan, (tensor_id, step))

    def topk(self, grad, residual, k, *, tensor_id, step, sample_ratio=0.01):
        """ops.pack_topk's pack (seed 0, no momentum), as a Packed of values and index."""
        plan = _top_plan(grad.numel(), k, sample_ratio)
        return self._add(_shared(), grad, residual, None, None, plan, (tensor_id, step))

    def rtopk(self, grad, residual, r, k, *, seed, tensor_id, step, sample_ratio=0.01):
        """ops.pack_rtopk's pack with no host read (its top_candidates reads its candidates'
        count): the state pass now; the exact top max(r, k) of acc at fixed capacity, whose count
        is known (the top plan keeps exactly that many); the k drawn among them and their send."""
        if residual is not None:
            ops.accumulate(grad, residual)
        plan = _top_plan(grad.numel(), max(r, k), sample_ratio)
        top, packed = QueuedPack(self), QueuedPack(self)
        # (seed 0: the top is exact whatever the sample that aims its threshold)
        self._tops.append(
            Queued(top, residual if residual is not None else grad, None, None, None, plan, (tensor_id, step))
        )
        self._draws.append(Draw(packed, top, plan.k, min(k, plan.k), residual, grad.dtype, (seed, tensor_id, step)))
        return self._queued(packed)

    def momentum_step(self, grad, momentum, *, momentum_factor, grad_scale=None, nesterov=False):
        """ops.momentum_step's dense payload (DGC's dense route), as a Packed of `grad` (contiguous),
        which the step writes in place."""
        packed = QueuedPack(self)
        self._steps.setdefault((momentum_factor, nesterov), []).append((packed, grad, momentum, grad_scale))
        return self._queued(packed)

    def clip_factor(self, grad, limit):
        """DGC's clipping factor of `grad` at `limit` (ops.clip_factors_into's), a 0-d float32
        tensor on its device, written when the queue runs, before the packs and steps that read it
        (a reader outside the queue runs it first)."""
        factor = torch.empty((), dtype=torch.float32, device=grad.device)
        self._clips.append((grad, limit, factor))
        return self._queued(factor)

    @contextlib.contextmanager
    def deferred(self, fixed=False):
        """Queues the packs made inside the block; runs them when it ends (also on an error: the
        state of a queued tensor is never left half-updated). `fixed`: they are made at fixed
        capacity (pack_sampled_fixed: on a GPU, the host reads nothing)."""
        self._deferring, self._fixed = True, fixed
        try:
            yield self
        finally:
            self._deferring = False
            self.run()
            self._fixed = False

    def run(self):
        """Runs every queued clipping factor, then every pack and momentum step (which read the
        factors): fills their Packeds and updates their states."""
        queue, self._queue = self._queue, {}
        steps, self._steps = self._steps, {}
        clips, self._clips = self._clips, []
        if clips:
            grads, limits, factors = zip(*clips)
            ops.clip_factors_into(list(grads), list(limits), list(factors))
        for shared, packs in queue.items():
            _run(shared, packs, self._fixed)
        tops, self._tops = self._tops, []
        draws, self._draws = self._draws, []
        if tops:
            _run(_shared(), tops, True)
        for draw in draws:
            draw.run()
        for (momentum_factor, nesterov), queued in steps.items():
            packeds, grads, momenta, scales = zip(*queued)
            ops.momentum_step_many(
                list(grads), list(momenta), momentum_factor, grad_scales=list(scales), nesterov=nesterov
            )
            for packed, grad in zip(packeds, grads):
                packed.values, packed.index = grad, None

    def _add(self, shared, grad, residual, momentum, grad_scale, plan, stream):
        packed = QueuedPack(self, shared.bits)
        self._queue.setdefault(shared, []).append(Queued(packed, grad, residual, momentum, grad_scale, plan, stream))
        return self._queued(packed)

    def _queued(self, made):
        """`made` (a Packed, or a clipping factor), made at once outside ``deferred()``."""
        if not self._deferring:
            self.run()
        return made


def _run(shared, packs, fixed):
    plans = [
        number for q in packs for number in (q.plan.k, q.plan.sample_count, q.plan.too_few, q.plan.too_many, *q.stream)
    ]
    args = (
        [q.grad for q in packs],
        [q.residual for q in packs],
        [q.momentum for q in packs],
        shared.momentum_factor,
        [q.grad_scale for q in packs],
        shared.nesterov,
        shared.masking,
        [q.plan.ratio for q in packs],
        plans,
        0,  # the selection stream's seed: 0 for Threshold's, DGC's and TopK's packs, as ops' composites
    )
    if shared.bits is not None:  # (queued at fixed capacity only: SampledPacks.sampled)
        codes, scales, indices, counts = ops.pack_quantized_fixed(*args, shared.bits)
        cut = _Cut(packs, counts)
        for q, code, scale, index, count in zip(packs, codes, scales, indices, counts.split(1)):
            q.packed.fixed, q.packed.scales, q.packed._cut = (code, scale, index, count), scale, cut
        return
    made = (ops.pack_sampled_fixed if fixed else ops.pack_sampled_many)(*args, shared.value_dtype)
    if not fixed:
        for q, value, index in zip(packs, *made):
            q.packed.values, q.packed.index = value, index
        return
    values, indices, counts = made
    cut = _Cut(packs, counts)
    for q, value, index, count in zip(packs, values, indices, counts.split(1)):  # (views cut by one op)
        q.packed.fixed, q.packed._cut = (value, index, count), cut
