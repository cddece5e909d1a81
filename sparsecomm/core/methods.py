"""The rules of each compression method, written once for both frameworks.

A Method is a validated settings object: the density at each step (warm-up schedules), what
one value costs on the wire, which exchanges may carry it, which state it keeps, and when a
step counts. The torch and TF compressors hold one and add only the kernels and collectives
of their framework (sparsecomm/torch/compression.py, sparsecomm/tensorflow/compression.py).
"""

import math

from . import selection, validate
from .cost import EXCHANGES
from .selection import BAND

# quantize= -> what a value travels as: a dtype name (the frameworks share dtype names) or bits.
QUANTIZED_VALUES = {None: None, "fp16": "float16", "bf16": "bfloat16", "1bit": 1, "2bit": 2}


class Method:
    """What every method shares. Subclasses set their settings in __init__ (validated) and
    override the class flags and the schedule where they differ."""

    shared_coordinates = False  # every rank picks the same coordinates: values ride Horovod's allreduce
    keeps_momentum = False  # a float32 momentum per tensor (DGC's momentum correction)
    counts_dense_steps = False  # a step sent dense advances the step (DGC: the warm-up counts it)
    bits = None  # 1 or 2: values travel as quantized codes (Threshold's quantize=)
    indexed = True  # coordinates are int32 indices: at most core.wire.MAX_INDEXED_NUMEL elements
    value_dtype = None  # a dtype name values travel as; None: the gradient's own

    def __init__(self, owner, ratio, error_feedback=True):
        self.owner = owner
        self.ratio = validate.check_ratio(owner, ratio)
        self.error_feedback = validate.check_flag(owner, "error_feedback", error_feedback)

    def settings(self):
        """The public settings, by name (compared across ranks, shown by settings())."""
        return {k: v for k, v in vars(self).items() if k != "owner"}

    def density(self, step):
        """The fraction of a tensor sent at a tensor's step."""
        return self.densities()[self.stage(step)]

    def densities(self):
        """Every density the schedule uses, in order of its stages (the last one stays)."""
        return [self.ratio]

    def stage(self, step, minimum=min):
        """The index in densities() of the density at `step` (plain arithmetic and `minimum`, so
        that a TF graph can evaluate it on a step tensor)."""
        return 0

    def value_bytes(self, element_size):
        """Bytes one sent value costs on the wire, for a gradient of `element_size` bytes."""
        return element_size

    def exchanges(self):
        """The exchanges that may carry this method's values (exchange='auto' picks among them)."""
        return EXCHANGES

    sampled = False  # a sampled threshold selects a count in a band around k (selection.BAND)

    def most_selected(self, k, numel):
        """The most elements one rank selects at k: what a fixed-capacity buffer must hold."""
        return min(numel, math.floor(BAND[1] * k) + 1) if self.sampled else k

    @property
    def keeps_residual(self):
        return self.error_feedback


class RandomBlock(Method):
    """Random-block (Eghlidi & Jaggi 2020): one cyclic block per step from (seed, step, name)."""

    shared_coordinates = True
    indexed = False  # the block is an int64 start: no indices, no size limit of its own

    def __init__(self, owner, ratio, seed=0, error_feedback=True):
        super().__init__(owner, ratio, error_feedback)
        self.seed = validate.check_seed(owner, seed)


class RandomK(RandomBlock):
    """Random-k with a shared seed: k distinct coordinates per step from (seed, step, name)."""

    indexed = True


class TopK(Method):
    """Exact top-k of the accumulated gradient."""


class RTopK(Method):
    """rTop-k (Barnes et al. 2020): k drawn at random from the top r."""

    def __init__(self, owner, ratio, r=None, seed=0, error_feedback=True):
        super().__init__(owner, ratio, error_feedback)
        self.r = validate.check_r(owner, self.ratio, r)
        self.seed = validate.check_seed(owner, seed)

    def seed_of(self, rank):
        """The seed of this rank's draw: independent per rank (selection.rank_seed)."""
        return selection.rank_seed(self.seed, rank)


class Threshold(Method):
    """Gradient dropping (Aji & Heafield 2017): a sampled threshold, optionally quantized values."""

    sampled = True

    def __init__(self, owner, ratio=0.01, quantize=None, sample_ratio=0.01, error_feedback=True, exchange="auto"):
        super().__init__(owner, ratio, error_feedback)
        self.sample_ratio = validate.check_ratio(owner, sample_ratio, "sample_ratio")
        self.quantize = validate.check_quantize(owner, quantize, exchange)

    @property
    def bits(self):
        """1 or 2 for quantized codes, else None."""
        kind = QUANTIZED_VALUES[self.quantize]
        return kind if isinstance(kind, int) else None

    @property
    def value_dtype(self):
        """The dtype name values travel as ('float16', 'bfloat16'), or None: the gradient's."""
        kind = QUANTIZED_VALUES[self.quantize]
        return kind if isinstance(kind, str) else None

    def value_bytes(self, element_size):
        if self.bits:
            return self.bits / 8
        return element_size if self.value_dtype is None else 2

    def exchanges(self):
        return ("dense", "allgather") if self.bits else EXCHANGES  # SparDL adds values: no codes


class DGC(Method):
    """Deep Gradient Compression (Lin et al. 2017): momentum correction, local clipping,
    momentum factor masking and the warm-up schedule ratio ** ((s + 1) / (stages + 1))."""

    keeps_momentum = True
    counts_dense_steps = True
    sampled = True

    def __init__(
        self,
        owner,
        ratio=0.001,
        momentum=0.9,
        momentum_masking=True,
        clip_norm=None,
        warmup_steps=0,
        warmup_stages=4,
        sample_ratio=0.01,
        nesterov=False,
    ):
        super().__init__(owner, ratio, True)
        self.sample_ratio = validate.check_ratio(owner, sample_ratio, "sample_ratio")
        self.nesterov = validate.check_flag(owner, "nesterov", nesterov)
        self.momentum = validate.check_dgc(owner, momentum, momentum_masking, clip_norm, warmup_steps, warmup_stages)
        self.momentum_masking = momentum_masking
        self.clip_norm = clip_norm
        self.warmup_steps = warmup_steps
        self.warmup_stages = warmup_stages

    def stage(self, step, minimum=min):
        if not self.warmup_steps:
            return 0
        return minimum(step * self.warmup_stages // self.warmup_steps, self.warmup_stages)

    def densities(self):
        stages = self.warmup_stages if self.warmup_steps else 0
        return [self.ratio ** ((s + 1) / (stages + 1)) for s in range(stages)] + [self.ratio]

    def momentum_args(self, grad_scale):
        """The momentum keywords of DGC's ops (momentum_step; pack_sampled, with the masking),
        given the clipping factor (None: no clipping)."""
        return dict(self.momentum_settings(), grad_scale=grad_scale)

    def momentum_settings(self):
        """The momentum keywords every tensor of a batched op shares (momentum_args less the factor)."""
        return dict(momentum_factor=self.momentum, nesterov=self.nesterov)

    def clip_limit(self, ranks, loss_scale=1.0):
        """Local gradient clipping: the threshold scaled by 1/sqrt(N) (the paper's rule), or None.
        Under a loss scaler the gradients are multiplied by its scale, and so is the threshold."""
        return None if self.clip_norm is None else self.clip_norm / math.sqrt(ranks) * loss_scale
