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


class Fixed:
    """A pack made at fixed capacity: its values and index (each its capacity long), or 1-/2-bit
    codes, scales and index, and its count, entry `at` of the op's int64 counts on the device (the
    first `count` are sent). `made`: the op's lists, (values, indices, counts) or (codes, scales,
    indices, counts). Iterates as the op's entries of this pack, its count last."""

    __slots__ = ("made", "at")

    def __init__(self, made, at):
        self.made, self.at = made, at

    values = codes = property(lambda self: self.made[0][self.at])
    scales = property(lambda self: self.made[1][self.at])  # (1-/2-bit packs only)
    index = property(lambda self: self.made[-2][self.at])
    counts = property(lambda self: self.made[-1])

    @property
    def count(self):
        """This pack's count, a 1-element int64 tensor (a view of the op's counts)."""
        return self.made[-1][self.at : self.at + 1]

    def __iter__(self):
        return iter((*(entries[self.at] for entries in self.made[:-1]), self.count))

    @staticmethod
    def lists_of(fixed):
        """The op's lists of `fixed` packs in order, counts one int64 tensor: the op's own where they
        are all of its packs in its order (a DDP bucket's), else gathered from the ops that made them."""
        made = fixed[0].made
        if len(fixed) == len(made[0]) and all(f.made is made and f.at == i for i, f in enumerate(fixed)):
            return made
        lists = ([f.made[j][f.at] for f in fixed] for j in range(len(made) - 1))
        return (*lists, torch.cat([f.count for f in fixed]))


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
        self._packs, self._cut, self._values, self._index, self._fixed = packs, None, None, None, None
        self._codes = self._scales = None
        self.bits = bits

    @property
    def fixed(self):
        made = self._fixed
        return made if made is None or isinstance(made, Fixed) else Fixed(*made)  # (made when read)


class _Cut:
    """Cuts the fixed-capacity packs of one op to their counts, read on the host once for all."""

    def __init__(self, packs, counts):
        self.packs, self.counts = packs, counts

    def __call__(self):
        for packed, count in zip(self.packs, self.counts.tolist()):
            fixed = packed.fixed
            if packed.bits is None:
                packed.values = fixed.values[:count]
            else:
                packed.codes, packed.scales = fixed.codes[: wire.code_bytes(count, packed.bits)], fixed.scales
            packed.index, packed._cut = fixed.index[:count], None


@dataclass
class Batch:
    """Packs of one op waiting: their Packeds and the op's arguments, a list each (one entry a
    tensor; None where a tensor has no such state), and their plans."""

    packeds: list
    grads: list
    residuals: list
    momenta: list
    grad_scales: list
    plans: tuple  # (each tensor's Plan, the op's plan numbers, its ratios): _op_plans'
    ids: list  # the selection streams' tensor ids
    steps: list


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
        fixed = self.top_pack.fixed
        acc, index = fixed.values[: self.top], fixed.index[: self.top]
        seed, tensor_id, step = self.stream
        pick = ops.random_k_indices(acc, self.k, seed=seed, tensor_id=tensor_id, step=step)
        self.packed.index = index[pick]
        self.packed.values = ops.send_selected(acc[pick].float(), self.packed.index, self.residual, self.dtype)


class SampledPacks:
    """A compressor's sampled packs and dense momentum steps. Each returns its Packed at once,
    filled by the op at once; inside ``deferred()`` they queue, and one op per Shared (per
    momentum setting) fills them when the block ends, or earlier when one of them is read."""

    def __init__(self):
        self._queue = {}  # Shared -> [Batch]
        self._steps = {}  # (momentum_factor, nesterov) -> [(Packed, grad, momentum, grad_scale)]
        self._clips = []  # [(grad, limit, factor)]: run first, the packs and steps read the factors
        self._tops = []  # [Batch]: rTop-k's top r of acc, at fixed capacity
        self._draws = []  # [Draw]: rTop-k's draws among them, and the sends
        self._deferring = False
        self._fixed = False  # the deferred packs at fixed capacity (QueuedPack.fixed)

    def sampled_many(self, grads, residuals, ratio, *, sample_ratio, ids, steps, momenta, grad_scales, **settings):
        """ops.pack_sampled's packs of gradients at one density, as Packeds of values and index (with
        bits, of codes, scales and index); per gradient its residual, momentum, clipping factor (None
        where absent) and selection stream (ids, steps). `settings`: Shared's (momentum_factor,
        nesterov, masking, value_dtype, bits). With bits they queue at fixed capacity only (a DDP
        bucket's); else each is made at once by the composite."""
        bits = settings.get("bits")
        if bits is not None and not (self._deferring and self._fixed):  # (Horovod's: variable-size segments)
            self.run()  # (DGC's clipping factors may wait in the queue)
            streams = zip(grads, residuals, ids, steps, momenta, grad_scales)
            return [_quantized(*stream, ratio, sample_ratio, settings) for stream in streams]
        plans = _sampled_plans(tuple(g.numel() for g in grads), ratio, sample_ratio)
        return self._add(_shared(**settings), Batch(None, grads, residuals, momenta, grad_scales, plans, ids, steps))

    def sampled(self, grad, residual, ratio, *, tensor_id, step, momentum=None, grad_scale=None, **settings):
        """sampled_many of one gradient."""
        streams = dict(ids=[tensor_id], steps=[step], momenta=[momentum], grad_scales=[grad_scale])
        return self.sampled_many([grad], [residual], ratio, **streams, **settings)[0]

    def topk_many(self, grads, residuals, ks, *, ids, steps, sample_ratio=0.01):
        """ops.pack_topk's packs (seed 0, no momentum) of gradients, as Packeds of values and index."""
        plans = _top_plans(tuple(g.numel() for g in grads), tuple(ks), sample_ratio)
        nones = [None] * len(grads)
        return self._add(_shared(), Batch(None, grads, residuals, nones, nones, plans, ids, steps))

    def topk(self, grad, residual, k, *, tensor_id, step, sample_ratio=0.01):
        """topk_many of one gradient."""
        return self.topk_many([grad], [residual], [k], ids=[tensor_id], steps=[step], sample_ratio=sample_ratio)[0]

    def rtopk(self, grad, residual, r, k, *, seed, tensor_id, step, sample_ratio=0.01):
        """ops.pack_rtopk's pack with no host read (its top_candidates reads its candidates'
        count): the state pass now; the exact top max(r, k) of acc at fixed capacity, whose count
        is known (the top plan keeps exactly that many); the k drawn among them and their send."""
        if residual is not None:
            ops.accumulate(grad, residual)
        plans = _top_plans((grad.numel(),), (max(r, k),), sample_ratio)
        top, packed, top_k = QueuedPack(self), QueuedPack(self), plans[0][0].k
        # (seed 0: the top is exact whatever the sample that aims its threshold)
        acc = residual if residual is not None else grad
        self._tops.append(Batch([top], [acc], [None], [None], [None], plans, [tensor_id], [step]))
        self._draws.append(Draw(packed, top, top_k, min(k, top_k), residual, grad.dtype, (seed, tensor_id, step)))
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

    def _add(self, shared, batch):
        batch.packeds = [QueuedPack(self, shared.bits) for _ in batch.grads]
        self._queue.setdefault(shared, []).append(batch)
        self._queued(None)
        return batch.packeds

    def _queued(self, made):
        """`made` (a Packed, or a clipping factor), made at once outside ``deferred()``."""
        if not self._deferring:
            self.run()
        return made


@functools.lru_cache(maxsize=256)
def _sampled_plans(numels, ratio, sample_ratio):
    """(each tensor's Plan.sampled, the op's plan numbers): made once per shapes and density."""
    return _op_plans(tuple(_sampled_plan(numel, ratio, sample_ratio) for numel in numels))


@functools.lru_cache(maxsize=256)
def _top_plans(numels, ks, sample_ratio):
    """(each tensor's Plan.top, the op's plan numbers): made once per shapes and k."""
    return _op_plans(tuple(_top_plan(numel, k, sample_ratio) for numel, k in zip(numels, ks)))


def _op_plans(plans):
    """(the plans, the op's plan numbers, its ratios): kPackPlan numbers a tensor (k, sample_count,
    too_few, too_many, then the stream's tensor_id and step, left 0 here to be set each step)."""
    numbers = [number for plan in plans for number in (plan.k, plan.sample_count, plan.too_few, plan.too_many, 0, 0)]
    return plans, numbers, [plan.ratio for plan in plans]


def _joined(batches, field):
    lists = [getattr(batch, field) for batch in batches]
    return lists[0] if len(lists) == 1 else [item for items in lists for item in items]


def _run(shared, batches, fixed):
    """One op for every queued batch of `shared`: fills their Packeds."""
    numbers = [number for batch in batches for number in batch.plans[1]]
    numbers[4::6], numbers[5::6] = _joined(batches, "ids"), _joined(batches, "steps")
    pack = ops.pack_sampled_fixed if fixed else ops.pack_sampled_many
    if shared.bits is not None:  # (queued at fixed capacity only: SampledPacks.sampled_many)
        pack = functools.partial(_pack_quantized, shared.bits)
    made = pack(
        _joined(batches, "grads"),
        _joined(batches, "residuals"),
        _joined(batches, "momenta"),
        shared.momentum_factor,
        _joined(batches, "grad_scales"),
        shared.nesterov,
        shared.masking,
        [ratio for batch in batches for ratio in batch.plans[2]],
        numbers,
        0,  # the selection stream's seed: 0 for Threshold's, DGC's and TopK's packs, as ops' composites
        shared.value_dtype,
    )
    packeds = _joined(batches, "packeds")
    if not fixed:
        for packed, value, index in zip(packeds, *made):
            packed.values, packed.index = value, index
        return
    cut = _Cut(packeds, made[-1])
    for at, packed in enumerate(packeds):
        packed._fixed, packed._cut = (made, at), cut
    if shared.bits is not None:  # (a quantized pack's scales need no cut: the loss scaler marks them)
        for packed, scales in zip(packeds, made[1]):
            packed._scales = scales


def _pack_quantized(bits, *args):
    """ops.pack_quantized_fixed with pack_sampled_fixed's arguments (its value dtype unused: codes)."""
    return ops.pack_quantized_fixed(*args[:-1], bits)


def _quantized(grad, residual, tensor_id, step, momentum, grad_scale, ratio, sample_ratio, settings):
    """One tensor's 1-/2-bit sampled pack, made at once (ops.pack_sampled's composite)."""
    (codes, scales), index = ops.pack_sampled(
        grad,
        residual,
        ratio,
        sample_ratio=sample_ratio,
        tensor_id=tensor_id,
        step=step,
        momentum=momentum,
        grad_scale=grad_scale,
        **settings,
    )
    return Packed(index=index, codes=codes, scales=scales, bits=settings["bits"])
